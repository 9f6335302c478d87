"""The helpers that SGLang's test kits and clients (lmms-eval's ``srt_api``) import from
``sglang.srt.utils``; SGLang's own module holds many more."""

from sglang.srt.utils.common import get_bool_env_var, is_cuda, kill_process_tree, temp_set_env

__all__ = ["get_bool_env_var", "is_cuda", "kill_process_tree", "temp_set_env"]
