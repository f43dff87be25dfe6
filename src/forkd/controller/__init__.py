"""The controller: small owners of state behind the thin Runtime facade (runtime.py)."""
