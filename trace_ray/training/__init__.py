"""GRPO training of one LoRA adapter per capability."""
