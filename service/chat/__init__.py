"""Each model family's chat language: tool-call syntaxes, their parsers and grammars, and the conversation
a chat template renders (tools, calls, results), adapted to what the template can render."""
