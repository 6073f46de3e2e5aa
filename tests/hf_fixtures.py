"""A random tiny Hugging Face checkpoint (Qwen3 layout, byte-level BPE tokenizer)."""

from rl_batch import hf
from rl_batch import model as model_lib
from rl_batch.tokenizers import HFTokenizer
from tests.test_tokenizers import make_hf_tokenizer


def make_tiny_hf_dir(directory):
    """Writes tokenizer.json, config.json and model.safetensors into ``directory``."""
    make_hf_tokenizer(directory)
    config = model_lib.ModelConfig(
        vocab_size=HFTokenizer(directory).vocab_size,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        intermediate_size=64,
        qk_norm=True,
        max_seq_len=256,
    )
    hf.save_hf_checkpoint(config, model_lib.init_params(config, 0), str(directory))
    return directory
