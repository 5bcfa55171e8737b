"""How a hook changes h: the steering spec, its operators and conditions, the handle that applies
them at every forward, and the same vectors written for other tools (`interop`)."""
