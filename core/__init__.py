"""Domain core: names, settings, message models, lifecycle decisions and the state store."""
