"""The recipe stage: a YAML file read into a typed, checked ``Recipe``.

``load``: the ``Recipe`` type, ``load_recipe`` and its parser (``extends:``, every field
checked with the fix); ``yamlfile``: YAML read with line numbers; ``presets``: the named
algorithm presets; ``engine_keys``, ``lora``, ``sft``: the engine keys a recipe's fields
mean; ``docs``: the fields' reference (docs/recipes.md).
"""
