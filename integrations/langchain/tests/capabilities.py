"""What `ChatLookahead` declares to LangChain's standard suites, shared by unit and integration."""

from langchain_rag_lookahead import ChatLookahead


class LocalChatModelCapabilities:
    """A local text model: no tools, structured or JSON output, images, or per-call model."""

    @property
    def chat_model_class(self) -> type[ChatLookahead]:
        return ChatLookahead

    @property
    def has_tool_calling(self) -> bool:
        return False

    @property
    def has_structured_output(self) -> bool:
        return False

    @property
    def supports_json_mode(self) -> bool:
        return False

    @property
    def supports_image_inputs(self) -> bool:
        return False

    @property
    def supports_model_override(self) -> bool:
        return False
