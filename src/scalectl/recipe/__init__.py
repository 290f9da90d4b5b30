"""Recipes: the schema of every axis, each field documented where it is declared
(:mod:`.schema`), the losses and launchers a recipe can choose (:mod:`.loss_choices`,
:mod:`.launcher_choices`), loading files, ``extends`` and overrides (:mod:`.load`), and
the documentation of a key for ``validate --explain`` and the unknown-key error
(:mod:`.explain`)."""
