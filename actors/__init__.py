"""The execution layer: thin actor shells over the library's factories (each usable with Ray
or in-process), the Ray runner (actors.plan: model actors fed work units by the driver)
and the in-process runner."""
