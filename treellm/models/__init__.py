"""Chat models: the ``ChatModel`` protocol, ``ScriptedModel`` and the OpenAI-compatible client."""
