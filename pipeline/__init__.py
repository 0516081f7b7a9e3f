"""shardscribe's library: audio I/O, sources and sinks, config, model families
(models/), decoder kinds (kinds/), the decoding algorithms (decoding/) and language
models (lm/). Never imports actors/ or jobs/, and never Ray."""
