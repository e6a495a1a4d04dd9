"""What the tests run rocmft with; not tests themselves, and never shipped (the wheel and the image take
entrypoint/ and templates/ only)."""
