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
    CirculantCall,
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
    # transforms (in place; each can be undone or made permanent)
    "block_circulant_",
    "remove_block_circulant_",
    "magnitude_prune_",
    "remove_pruning_",
    "transition_exact_",
    "transition_projection_",
    "set_forward_path_",
    "load_compressed_state_dict_",
    "reset_optimizer_state_",
    # what a layer is
    "is_block_circulant",
    "block_size_of",
    "circulant_vectors",
    "is_pruned",
    "sparsity_of",
    "eligible_layers",
    "find_networks",
    "CompressionReport",
    # schedules and their configs
    "GSTConfig",
    "GSTSchedule",
    "RewardAwareConfig",
    "RewardAwareSparsity",
    "GradualPruning",
    "GradualPruningConfig",
    "gradual_sparsity",
    # measures
    "compression_ratio",
    "average_compression_ratio",
    "covered_fraction",
    "layer_report",
    "weight_bytes_per_update",
]
"""What a user calls. The building blocks (the circulant algebra of :mod:`rlq.compress.circulant`, GST's action
and hook records, optimizer-state parking) stay importable from here and from their modules."""
