"""The Kubernetes API's value rules, pure: quantities, semantic versions, names and labels."""
