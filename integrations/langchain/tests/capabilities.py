"""What `ChatLookahead` declares to LangChain's standard suites, shared by unit and integration."""

from langchain_rag_lookahead import ChatLookahead


class LocalChatModelCapabilities:
    """A local text model with tool calling, tool choice, structured output and JSON mode (the
    last three by constrained decoding); no images or per-call model."""

    @property
    def chat_model_class(self) -> type[ChatLookahead]:
        return ChatLookahead

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        # The suites then force calls with tool_choice="any": a 135M model cannot be relied on
        # to call a tool unforced, and a forced call is decoded under the tool's grammar.
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def structured_output_kwargs(self) -> dict[str, str]:
        return {"method": "json_schema"}

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def supports_image_inputs(self) -> bool:
        return False

    @property
    def supports_model_override(self) -> bool:
        return False
