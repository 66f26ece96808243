"""The vLLM family, inside its environment: the only code of kvspec that
imports vLLM. It resolves a deployment with vLLM's own config code
(:mod:`.resolve`, :mod:`.setup`), runs a case through vLLM's real scheduler
and KV-cache manager (:mod:`.driver`, :mod:`.steploop`), and reports what it
observed (:mod:`.observe`, :mod:`.writes`). It observes; it never judges."""
