"""JSON extraction under a schema: constrained decoding with lookahead vs constrained plain.

Each record's context is turned into fields of one JSON schema (the answer to its question,
the sentence of the context that supports it, a title and the names it mentions), asked of the
default model with the context in the prompt. Both methods decode under the same grammar;
plain is the engine with lookahead off (the tests prove it equal to ``generate`` with the
grammar's mask). Methods alternate per record, so a busy machine slows both alike. Reported:
tokens/s, outputs identical to constrained plain, answers that parse and validate against the
schema, and what the steps that got tokens accepted drafted from (the grammar's forced
tokens, the context, past outputs, ...).

    python benchmarks/extraction.py --data dolly_context_qa.jsonl --limit 12 --json extraction-dolly.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema
import torch

from rag_lookahead import Grammar, LookaheadEngine
from rag_lookahead.bench.run import load_records, run_header

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 60},
        "answer": {"type": "string", "maxLength": 200},
        "evidence": {"type": "string", "maxLength": 300},
        "names": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 4},
    },
    "required": ["title", "answer", "evidence", "names"],
    "additionalProperties": False,  # as OpenAI's strict structured outputs: no keys of its own
}
SYSTEM = (
    "You extract information from a context into JSON with the fields title (what the context is "
    "about), answer (the answer to the question), evidence (the sentence of the context that "
    "answers it, copied exactly) and names (people, places and organisations the context names)."
)


def messages(record: dict[str, str]) -> list[dict[str, str]]:
    user = f"Context:\n{record['context']}\n\nQuestion: {record['question']}"
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def run(engine: LookaheadEngine, records: list[dict[str, str]], max_new_tokens: int) -> dict[str, Any]:
    grammar = Grammar.json_schema(SCHEMA)
    methods = {"constrained_plain": engine.plain(), "constrained_lookahead": engine}
    totals = {name: {"seconds": 0.0, "new_tokens": 0, "steps": 0, "valid": 0} for name in methods}
    outputs: dict[str, list[list[int]]] = {name: [] for name in methods}
    sources: Counter[str] = Counter()
    warm = messages({"context": "Warm-up.", "question": "Nothing?"})
    for method in methods.values():  # first-call costs (the probe, the grammar's view) untimed
        method.complete(warm, max_new_tokens=8, grammar=grammar)
    for i, record in enumerate(records):
        order = list(methods) if i % 2 == 0 else list(methods)[::-1]
        for name in order:
            started = time.perf_counter()
            completion = methods[name].complete(
                messages(record), max_new_tokens=max_new_tokens, grammar=grammar
            )
            total = totals[name]
            total["seconds"] += time.perf_counter() - started
            total["new_tokens"] += completion.stats.new_tokens
            total["steps"] += completion.stats.steps
            total["valid"] += _valid(completion.text, completion.stats.finish_reason)
            outputs[name].append(completion.token_ids)
            if name == "constrained_lookahead":
                for accepted, source in zip(
                    completion.stats.accepted_per_step, completion.stats.draft_sources, strict=True
                ):
                    for part in source.split("+"):
                        sources[part] += accepted
    plain = totals["constrained_plain"]
    answers = outputs["constrained_lookahead"]
    texts = [engine.tokenizer.decode(ids, skip_special_tokens=True) for ids in answers]
    report: dict[str, Any] = {
        **run_header(engine, len(records), max_new_tokens),
        "cpu": platform.processor() or platform.machine(),
        "schema": SCHEMA,
        "methods": {},
        # A step that drafted from several sources counts for each of them.
        "accepted_in_steps_drafting_from": dict(sources.most_common()),
        "answers": texts,
    }
    for name, total in totals.items():
        rate = total["new_tokens"] / total["seconds"]
        report["methods"][name] = {
            **{k: round(v, 3) if isinstance(v, float) else v for k, v in total.items()},
            "tokens_per_s": round(rate, 3),
            "speedup_vs_constrained_plain": round(rate / (plain["new_tokens"] / plain["seconds"]), 3),
            "identical_to_constrained_plain": sum(
                a == b for a, b in zip(outputs[name], outputs["constrained_plain"], strict=True)
            ),
            "schema_valid": total["valid"],
        }
    return report


def _valid(text: str, finish_reason: str | None) -> bool:
    if finish_reason != "eos":  # cut by max_new_tokens: not a whole answer
        return False
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="JSONL with 'question' and 'context'")
    parser.add_argument("--limit", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = LookaheadEngine.from_pretrained(args.model)
    engine.measure_costs()
    report = {"data": args.data.name, **run(engine, load_records(args.data, args.limit), args.max_new_tokens)}
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
