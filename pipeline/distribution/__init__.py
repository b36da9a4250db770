"""What happens to built artifacts: DVC stages, the Hugging Face upload, verification on devices, CI gating
of changed recipes, and the rebuild check."""
