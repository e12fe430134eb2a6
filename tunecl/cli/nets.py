"""The help texts of ``--net`` and ``--image-size``, shared by ``tunecl validate``, ``bench`` and ``tune``."""

NET_HELP = ("torchvision model (resnet50, convnext_small, vit_b_16, swin_t), a Hugging Face language model "
            "with random weights (hf:bert: BERT for sequence classification; hf:gpt2: GPT-2 LM head, loss on "
            "the next tokens; both small configs, hidden 64 in 2 layers; hf:bert-base and hf:gpt2-base: the "
            "published base sizes, hidden 768 in 12 layers; all take random token ids and need the "
            "transformers package), or package.module:factory")


def size_help(default: int) -> str:
    """``--image-size``'s help: the image side, or the sequence length of an ``hf:`` model."""
    return (f"input height/width (default {default}); for hf: models the sequence length in tokens "
            f"(at most 512; hf:gpt2-base 1024); vit_* models are built for this size")
