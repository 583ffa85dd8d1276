"""TRM scaling study."""
