"""Development tools kept out of the installed package: the tiny families' recipes and registry
(``tiny_models``), quantized-checkpoint writers in the published formats
(``quantized_checkpoints``) and synthetic video clips (``video_clips``). Tests and benchmarks
import them from the repository root."""
