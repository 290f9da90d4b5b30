"""Recipes: the schema of every axis (:mod:`.schema`), the losses a recipe can choose
(:mod:`.loss_choices`), and loading files, ``extends`` and overrides (:mod:`.load`)."""
