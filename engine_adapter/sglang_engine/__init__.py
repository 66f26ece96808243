"""SGLang's engine family: the only code that imports SGLang (runs inside an SGLang environment)."""
