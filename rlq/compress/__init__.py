"""rlq.compress: block-circulant weights, magnitude pruning and GST's schedule, as nn.Module transforms.

Pure PyTorch (no RL library): every transform works on an SB3 policy, a plain MLP or a ResNet alike, in
place, with a trailing underscore, and can be undone or made permanent. Block-circulant layers use
``torch.nn.utils.parametrize``; masks use ``torch.nn.utils.prune``. Which layers are touched is decided
once, per network (:func:`find_networks`, :func:`eligible_layers`).

Paper: Lee et al., "GST: Group-Sparse Training for Accelerating Deep Reinforcement Learning",
arXiv 2101.09650. The reward-aware sparsity rule, the meaning of S_shift and the exact block-size
transition are our own designs (the paper does not publish them) and are documented as such.
"""

from rlq.compress.block_circulant import (
    BlockCirculantWeight,
    block_circulant_,
    block_size_of,
    circulant_vectors,
    is_block_circulant,
    make_block_circulant_,
    remove_block_circulant_,
    set_forward_path_,
)
from rlq.compress.circulant import (
    choose_forward_path,
    circulant_matmul_fft,
    circulant_projection,
    clear_expansion_index_cache,
    clear_forward_path_cache,
    expand_circulant,
    is_block_circulant_matrix,
    measure_forward_paths,
    residue_permutation,
    split_circulant_vectors,
)
from rlq.compress.gradual import GradualPruning, GradualPruningConfig
from rlq.compress.gst import GSTAction, GSTConfig, GSTHooks, GSTSchedule
from rlq.compress.layers import (
    CompressionReport,
    classify_layers,
    eligible_layers,
    find_networks,
)
from rlq.compress.measures import (
    average_compression_ratio,
    compression_ratio,
    covered_fraction,
    layer_report,
    weight_bytes_per_update,
)
from rlq.compress.optimizer_state import park_masked_state_, reset_optimizer_state_
from rlq.compress.pruning import gradual_sparsity, is_pruned, magnitude_prune_, remove_pruning_, sparsity_of
from rlq.compress.reward_aware import RewardAwareConfig, RewardAwareSparsity
from rlq.compress.state import compression_structure, load_compressed_state_dict_
from rlq.compress.transitions import (
    parameter_shift,
    split_blocks_exact_,
    transition_exact_,
    transition_projection_,
)

__all__ = [
    "BlockCirculantWeight",
    "CompressionReport",
    "GSTAction",
    "GSTConfig",
    "GSTHooks",
    "GSTSchedule",
    "GradualPruning",
    "GradualPruningConfig",
    "RewardAwareConfig",
    "RewardAwareSparsity",
    "average_compression_ratio",
    "block_circulant_",
    "block_size_of",
    "choose_forward_path",
    "circulant_matmul_fft",
    "circulant_projection",
    "circulant_vectors",
    "classify_layers",
    "clear_expansion_index_cache",
    "clear_forward_path_cache",
    "compression_ratio",
    "compression_structure",
    "covered_fraction",
    "eligible_layers",
    "expand_circulant",
    "find_networks",
    "gradual_sparsity",
    "is_block_circulant",
    "is_block_circulant_matrix",
    "is_pruned",
    "layer_report",
    "load_compressed_state_dict_",
    "magnitude_prune_",
    "make_block_circulant_",
    "measure_forward_paths",
    "parameter_shift",
    "remove_block_circulant_",
    "remove_pruning_",
    "park_masked_state_",
    "reset_optimizer_state_",
    "residue_permutation",
    "set_forward_path_",
    "sparsity_of",
    "split_blocks_exact_",
    "split_circulant_vectors",
    "transition_exact_",
    "transition_projection_",
    "weight_bytes_per_update",
]
