"""Published memory methods as plugins: each is a package that registers its parts through memrl's registries
(an extractor, a prompt template, a step credit...) and ships recipes over a base in ``configs/``.

A recipe turns a method on with ``plugins: [memrl.methods.<name>]``: the config loader imports the module before
anything is built, so the names it registers are valid everywhere in the config. A method of your own works the
same way from your package (``plugins: [my_pkg.my_method]``). See docs/methods.md.
"""
