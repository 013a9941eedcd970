"""The real-model zoo: Hugging Face transformers families with tiny random configs, each profiled
as users profile them and checked against an unprofiled run and torch's own figures (issue 35)."""
