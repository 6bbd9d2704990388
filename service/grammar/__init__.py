"""Grammar internals behind service.json_grammar: schema preparation, token masks, the compile cache, JSON key guard."""
