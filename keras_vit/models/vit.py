"""The Vision Transformer model (Dosovitskiy et al., 2021, §3.1).

Shapes: B batch, H x W image, C channels, P patch size, (h, w) = (H / P, W / P) token grid,
N = h * w patches, T = prefix tokens + N, D model width, K heads.
"""

import dataclasses
import inspect

import keras
from keras import ops

from keras_vit import distribution, naflex, upstream
from keras_vit.layers import (
    BlockConfig,
    POOLING_MODES,
    POSITION_EMBEDDING_KINDS,
    RESAMPLE_METHODS,
    ClassifierHead,
    ClassToken,
    Encoder,
    PatchEmbedding,
    PositionEmbedding,
    RegisterTokens,
    ResNetStem,
)
from keras_vit.layers.transformer import select_blocks
from keras_vit.models import lora, quantization as quantization_lib
from keras_vit.models.presets import PRESETS, is_architecture, preset_config
from keras_vit.preprocessing import Preprocessing


@keras.saving.register_keras_serializable(package="keras_vit")
class ViT(keras.Model):
    """Vision Transformer: patch embedding, class token, position embedding, encoder, head.

    Args:
        image_size: int or (H, W), the input resolution.
        patch_size: P; must divide H and W (with a `stem`, the feature map's height and width).
        num_channels: C.
        hidden_dim: D.
        num_layers: encoder depth L.
        num_heads: K; must divide D.
        mlp_dim: MLP hidden width.
        num_classes: classifier outputs; 0 gives pooled features.
        pooling: "token" (class token, the paper's default), "gap" (mean of patch tokens),
            "map" (multihead attention pooling of the patch tokens, as big_vision and SigLIP) or
            "none" (no pooling: the head maps every patch token, output (B, N, num_classes), as
            big_vision's pool_type="none"). "token" with `class_token=False` reads the first
            patch token, as big_vision's pool_type="0".
        representation_size: width of the tanh pre-logits layer, or None.
        dropout_rate: dropout after the embeddings, after each attention output and in the MLPs.
        attention_dropout_rate: dropout on the attention probabilities.
        drop_path_rate: stochastic depth; it grows linearly with depth up to this rate.
        layer_norm_epsilon: 1e-6 as in the official code (timm and Hugging Face use 1e-6 and 1e-12).
        gelu_approximate: tanh-approximate GELU, as Google's checkpoints were trained.
        class_token: whether to prepend a class token; None means `pooling == "token"`.
        position_embedding: "learned" or "sincos".
        layer_scale_init: LayerScale initial value, or None.
        image_mean: per-channel mean the model expects on pixels scaled to [0, 1]; the
            default 0.5, with `image_std` 0.5, maps them to [-1, 1] as Google's checkpoints do.
        image_std: per-channel standard deviation, as `image_mean`.
        image_resize: the filter that resizes an image to `image_size`, one of
            `keras_vit.preprocessing.RESIZE` ("bilinear", "bicubic", ...).
        image_antialias: whether a shrunk image is low-pass filtered first (see `Preprocessing`).
        image_crop: "center" (the centered box of the input's aspect ratio), "none" (the whole
            image stretched) or "pad" (the whole image on black). These and the mean, std, size
            and channels are the model's `preprocessing`, which the training pipeline, the demo
            and the export read; the defaults are what `keras.layers.Resizing` did in training
            before the record existed, so older files keep it.
        resample_method: how `resize` resamples the position embeddings by default, "bilinear"
            (official code), "bicubic" (timm) or "bicubic_no_antialias" (transformers' DINOv2 and
            SigLIP); see `resample_position_embedding`.
        preset: the preset name this model was built from, kept for display.
        class_names: names of the `num_classes` outputs, or None.
        num_register_tokens: R learned register tokens after the class token (Darcet et al.,
            2024; timm `reg_tokens`). They are prefix tokens: pooling, attention rollout and the
            feature grid skip them.
        qk_norm: a ViT-22B switch of `TransformerBlock`: LayerNorm on queries and keys.
        parallel_block: a ViT-22B switch: attention and MLP in parallel in each block.
        use_bias: a ViT-22B switch when False: no QKV or LayerNorm biases, including the
            final and MAP-head LayerNorms.
        stem: None (patches of pixels) or "resnet50": the hybrid of §3.1, whose tokens are the
            P x P patches (P = 1 in the paper) of a BiT ResNet-50 feature map.
        stem_layers: units per ResNet stage; None means (3, 4, 9) (stage 3 extended, stride 16).
        fc_norm: move the final LayerNorm from the encoder output to the pooled features, as timm
            does by default for average pooling (`fc_norm=True`); `forward_features` is then
            un-normalized.
        head_initializer: the classifier kernel's initializer: Glorot for training from scratch, or
            "zeros", the paper's new fine-tuning head (§3.2; `keras_vit.load` uses it for a new
            `num_classes`).
        dynamic_image_size: take images of any height and width that `token_pixels` divides, as
            timm's `dynamic_img_size`: the position table (learned, for `image_size`) is resampled
            inside `call` to each input's token grid with `resample_method`, and a sin-cos table is
            computed for it. At `image_size` nothing is resampled. Each new shape traces anew under
            `jit` and `tf.function`.
        max_seq_len: None, or the token budget L of the patch sequences (NaFlex) that this model
            is served with: its demo, export and `keras_vit.naflex.patch_sequences` give each image
            at its own aspect ratio, scaled to at most L patches. Every model takes patch sequences
            (see Input) whatever this is; it says which input the model is meant for.
        resample_keep_aspect: resample the position table to the square of the longer side of the
            new grid and crop it, so that both axes scale alike (timm's `pos_embed_ar_preserving`),
            for `dynamic_image_size` and patch sequences; False resamples each axis to its size.
        quantization: None, or the record of which layers `quantize` quantized and how (see
            `keras_vit.models.quantization`); a model built with it is quantized the same way, so
            that a quantized model's `.keras` file loads.

    Input: images (B, H, W, C), already normalized (see `normalize`); or patch sequences, the dict
    of timm's NaFlexVit (`keras_vit.naflex`): "patches" (B, L, P * P * C), "patch_coord" (B, L, 2)
    and "patch_valid" (B, L), each image at its own grid and aspect ratio, the padding masked in
    attention and pooling, each image's position embedding resampled to its own grid.
    Output: logits (B, num_classes) in float32, or features (B, D) when `num_classes=0`; with
    pooling="none", (B, N, num_classes or D) (for patch sequences N = L, padding included).
    """

    def __init__(
        self,
        image_size=224,
        patch_size=16,
        num_channels=3,
        hidden_dim=768,
        num_layers=12,
        num_heads=12,
        mlp_dim=3072,
        num_classes=1000,
        pooling="token",
        representation_size=None,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        drop_path_rate=0.0,
        layer_norm_epsilon=1e-6,
        gelu_approximate=False,
        class_token=None,
        position_embedding="learned",
        layer_scale_init=None,
        image_mean=None,
        image_std=None,
        image_resize="bilinear",
        image_antialias=False,
        image_crop="center",
        resample_method="bilinear",
        preset=None,
        class_names=None,
        num_register_tokens=0,
        qk_norm=False,
        parallel_block=False,
        use_bias=True,
        stem=None,
        stem_layers=None,
        fc_norm=False,
        head_initializer="glorot_uniform",
        dynamic_image_size=False,
        max_seq_len=None,
        resample_keep_aspect=False,
        quantization=None,
        **kwargs,
    ):
        kwargs.setdefault("name", "vit")
        super().__init__(**kwargs)
        self.image_size = _check_pair("image_size", image_size)
        self.patch_size = _check_positive("patch_size", patch_size)
        self.num_channels = _check_positive("num_channels", num_channels)
        self.hidden_dim = _check_positive("hidden_dim", hidden_dim)
        self.num_layers = _check_positive("num_layers", num_layers)
        self.num_heads = _check_positive("num_heads", num_heads)
        self.mlp_dim = _check_positive("mlp_dim", mlp_dim)
        self.num_classes = _check_positive("num_classes", num_classes, allow_zero=True)
        if pooling not in POOLING_MODES:
            raise ValueError(f"pooling={pooling!r} is not allowed; use one of {POOLING_MODES}")
        _check_choice("stem", stem, (None, "resnet50"))
        self.stem_kind = stem
        self.stem_layers = None if stem is None else tuple(stem_layers or (3, 4, 9))
        self.fc_norm = bool(fc_norm)
        self.dynamic_image_size = bool(dynamic_image_size)
        self.max_seq_len = None if max_seq_len is None else naflex.check_budget(max_seq_len)
        self.resample_keep_aspect = bool(resample_keep_aspect)
        self.head_initializer = keras.initializers.get(head_initializer)
        self.num_register_tokens = _check_positive("num_register_tokens", num_register_tokens, allow_zero=True)
        self.qk_norm = bool(qk_norm)
        self.parallel_block = bool(parallel_block)
        self.use_bias = bool(use_bias)
        _check_choice("position_embedding", position_embedding, POSITION_EMBEDDING_KINDS)
        _check_choice("resample_method", resample_method, RESAMPLE_METHODS)
        self.stem = None if stem is None else ResNetStem(self.stem_layers, dtype=self.dtype_policy, name="stem")
        if stem is not None and any(s % (self.stem.stride * self.patch_size) for s in self.image_size):
            step = self.stem.stride * self.patch_size
            raise ValueError(
                f"image_size={self.image_size} is not a multiple of {step}, the stem's stride {self.stem.stride} "
                f"times patch_size={self.patch_size}; use a multiple of {step}"
            )
        if any(s % self.patch_size for s in self.image_size):
            raise ValueError(
                f"patch_size={self.patch_size} does not divide image_size={self.image_size}; "
                f"use an image size that is a multiple of {self.patch_size}"
            )
        if self.hidden_dim % self.num_heads:
            raise ValueError(
                f"num_heads={self.num_heads} does not divide hidden_dim={self.hidden_dim}; "
                f"use a divisor of {self.hidden_dim}"
            )
        self.pooling = pooling
        self.representation_size = representation_size
        self.dropout_rate = dropout_rate
        self.attention_dropout_rate = attention_dropout_rate
        self.drop_path_rate = drop_path_rate
        self.layer_norm_epsilon = layer_norm_epsilon
        self.gelu_approximate = gelu_approximate
        self.class_token = pooling == "token" if class_token is None else bool(class_token)
        if pooling == "token" and not self.class_token and self.num_register_tokens:
            raise ValueError('pooling="token" reads the class token, but class_token=False; pass class_token=True '
                             'or pooling="gap" / "map"')
        self.position_embedding_kind = position_embedding
        self.layer_scale_init = layer_scale_init
        self.image_mean = _channels("image_mean", image_mean, self.num_channels)
        self.image_std = _channels("image_std", image_std, self.num_channels)
        self.image_resize, self.image_antialias, self.image_crop = image_resize, bool(image_antialias), image_crop
        self.preprocessing = Preprocessing(self.image_size, self.image_mean, self.image_std, image_resize,
                                           self.image_antialias, image_crop, self.num_channels)
        self.resample_method = resample_method
        self.preset = preset
        self.class_names = None if class_names is None else tuple(str(c) for c in class_names)
        if self.class_names is not None and len(self.class_names) != self.num_classes:
            raise ValueError(
                f"class_names has {len(self.class_names)} names but num_classes={self.num_classes}"
            )
        quantization = quantization_lib.check_record(quantization)
        self._build_layers()
        self.build((None, *self.image_size, self.num_channels))
        self.quantization = None
        if quantization is not None:
            quantization_lib.apply(self, quantization)
            self.quantization = quantization

    def _build_layers(self):
        policy = self.dtype_policy
        self.patch_embedding = PatchEmbedding(
            self.hidden_dim, self.patch_size, dtype=policy, name="patch_embedding"
        )
        self.cls_token = ClassToken(dtype=policy, name="class_token") if self.class_token else None
        self.registers = None
        if self.num_register_tokens:
            self.registers = RegisterTokens(self.num_register_tokens, dtype=policy, name="registers")
        self.position_embedding = PositionEmbedding(
            self.grid_size,
            num_prefix_tokens=self.num_prefix_tokens,
            kind=self.position_embedding_kind,
            dtype=policy,
            name="position_embedding",
        )
        self.embedding_dropout = keras.layers.Dropout(self.dropout_rate, dtype=policy, name="dropout")
        block = BlockConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(BlockConfig)})
        self.encoder = Encoder(self.num_layers, block, final_norm=not self.fc_norm, dtype=policy, name="encoder")
        self.head = ClassifierHead(
            self.num_classes,
            pooling=self.pooling,
            representation_size=self.representation_size,
            num_prefix_tokens=self.num_prefix_tokens,
            block=block,
            fc_norm=self.fc_norm,
            kernel_initializer=self.head_initializer,
            dtype=policy,
            name="head",
        )

    @property
    def grid_size(self):
        """(h, w), the token grid."""
        return (self.image_size[0] // self.token_pixels, self.image_size[1] // self.token_pixels)

    @property
    def token_pixels(self):
        """The side in input pixels of one token's cell: P, or P times the stem's stride."""
        return self.patch_size * (1 if self.stem is None else self.stem.stride)

    @property
    def num_prefix_tokens(self):
        """Tokens before the patch grid: the class token, then the register tokens."""
        return int(self.class_token) + self.num_register_tokens

    def build(self, input_shape):
        self._check_input_shape(input_shape)
        tokens = (input_shape[0], self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1], self.hidden_dim)
        if self.stem is not None:
            self.stem.build(input_shape)
            input_shape = self.stem.compute_output_shape(input_shape)  # (B, h * P, w * P, F)
        self.patch_embedding.build(input_shape)
        if self.registers is not None:
            self.registers.build(tokens)
        if self.cls_token is not None:
            self.cls_token.build(tokens)
        self.position_embedding.build(tokens)
        self.encoder.build(tokens)
        self.head.build(tokens)

    def _check_input_shape(self, shape):
        if len(shape) != 4:
            raise ValueError(f"ViT takes images of shape (B, H, W, C); got shape {tuple(shape)}")
        if shape[-1] is not None and shape[-1] != self.num_channels:
            raise ValueError(
                f"images have {shape[-1]} channels but this model takes num_channels={self.num_channels}"
            )
        if self.dynamic_image_size:
            return self._check_divisible(tuple(shape[1:3]))
        if None not in shape[1:3] and tuple(shape[1:3]) != self.image_size:
            raise ValueError(
                f"images are {tuple(shape[1:3])} but this model takes image_size={self.image_size}; "
                "resize the images, or the model with keras_vit.resize(model, image_size)"
            )

    def _check_divisible(self, size):
        """Raises a ValueError for a static height or width that `token_pixels` does not divide."""
        step = self.token_pixels
        for side, n in zip(("height", "width"), size):
            if isinstance(n, int) and n % step:  # a symbolic side (jax.export) is checked by no one here
                nearest = " or ".join(str(m) for m in (n // step * step, n // step * step + step) if m)
                what = "patch_size" if self.stem is None else "the stem's stride times patch_size"
                raise ValueError(f"images are {size[0]} x {size[1]}, but this model takes a height and width that "
                                 f"are multiples of {step} ({what}); the nearest valid {side} is {nearest}")

    def token_grid(self, images):
        """(h, w), the token grid of `images` (B, H, W, C): `grid_size` unless `dynamic_image_size`;
        then from the images' shape, in Python ints where it is static, else symbolic."""
        if not self.dynamic_image_size:
            return self.grid_size
        shape = ops.shape(images)
        return (shape[1] // self.token_pixels, shape[2] // self.token_pixels)

    def patch_grid(self, tokens, grid=None):
        """Rows over the tokens (B, T, ...) -> the patch tokens on the token grid (B, h, w, ...), the
        prefix tokens dropped; `grid` is (h, w), by default `grid_size` (see `token_grid`). The one
        "tokens to grid" rule of the features, the explanations and the app."""
        rest = tuple(tokens.shape[2:])
        return ops.reshape(tokens[:, self.num_prefix_tokens :], (-1, *(grid or self.grid_size), *rest))

    def summary_row(self, rows, token_mask=None):
        """(..., T, T) rows of a token mixing (attention, rollout) -> (..., T): the row of what the
        head reads: row 0 for pooling="token" (the class token, or the first patch without one),
        else the mean of the patch rows ("gap", "map", "none"), over the valid patches of patch
        sequences when `token_mask` (B, T) is given (rows (B, ..., T, T)). The one "which row the
        head reads" rule of attention rollout, attention maps and class relevance."""
        if self.pooling == "token":
            return rows[..., 0, :]
        patches = rows[..., self.num_prefix_tokens :, :]  # (..., N, T)
        if token_mask is None:
            return ops.mean(patches, axis=-2)
        weights = ops.cast(token_mask[:, self.num_prefix_tokens :, None], patches.dtype)  # (B, N, 1)
        for _ in range(len(rows.shape) - 3):  # (B, N, 1) -> (B, 1, ..., N, 1), against (B, ..., N, T)
            weights = ops.expand_dims(weights, 1)
        return ops.sum(patches * weights, axis=-2) / ops.sum(weights, axis=-2)  # the mean of the valid rows

    def embed_tokens(self, images, training=None):
        """The encoder's input (B, T, D): patches, prefix tokens and position embedding, of images
        or of patch sequences (T = R + L)."""
        if naflex.is_patch_sequence(images):
            return self.embedding_dropout(self._embed_sequences(images), training=training)
        self._check_input_shape(images.shape)
        grid = self.token_grid(images) if self.dynamic_image_size else None
        x = images if self.stem is None else self.stem(images)  # (B, H, W, C) -> (B, H / s, W / s, F)
        x = self.patch_embedding(x)  # (B, H, W, C) -> (B, N, D)
        x = self._prepend_prefix(x)
        x = self.position_embedding(x, grid=grid, method=self.resample_method, keep_aspect=self.resample_keep_aspect)
        return self.embedding_dropout(x, training=training)

    def _embed_sequences(self, inputs):
        """Patch sequences (see `keras_vit.naflex`) -> (B, R + L, D)."""
        patches, coord, valid = self.check_patch_sequences(inputs)
        x = self.patch_embedding.project_patches(patches)  # (B, L, P P C) -> (B, L, D)
        return self.position_embedding(self._prepend_prefix(x), method=self.resample_method, patch_coord=coord,
                                       keep_aspect=self.resample_keep_aspect, grids=naflex.grids(coord, valid))

    def _prepend_prefix(self, x):
        if self.registers is not None:
            x = self.registers(x)  # (B, N, D) -> (B, R + N, D)
        if self.cls_token is not None:
            x = self.cls_token(x)  # (B, N, D) -> (B, 1 + N, D)
        return x

    def check_patch_sequences(self, inputs):
        """(patches, patch_coord, patch_valid) of the dict `inputs`, after one-line ValueErrors for
        a wrong key or shape, and, where the values are known (an eager call), for an image without
        a valid token or with coordinates off its grid (see `keras_vit.naflex.check_values`)."""
        if self.stem is not None:
            raise ValueError("patch sequences are cut into patches of pixels, and this model's tokens are patches "
                             "of a ResNet stem's features; give it images (B, H, W, C)")
        patches, coord, valid = naflex.check_shapes(inputs, self.patch_size, self.num_channels)
        values = [naflex.concrete(t) for t in (coord, valid)]
        if all(v is not None for v in values):
            naflex.check_values(*values)
        return patches, coord, valid

    def token_mask(self, images):
        """(B, T) bool, False for the padding tokens of patch sequences; None for images."""
        if not naflex.is_patch_sequence(images):
            return None
        return naflex.token_mask(images["patch_valid"], self.num_prefix_tokens)

    def forward_features(self, images, training=None, return_attention_scores=False):
        """Normalized encoder output (B, T, D); with `return_attention_scores` also the list of
        per-layer attention probabilities (B, K, T, T). Padding tokens are attended by none."""
        x = self.embed_tokens(images, training=training)
        return self.encoder(x, training=training, return_attention_scores=return_attention_scores,
                            attention_mask=self.attention_mask(images))

    def attention_mask(self, images):
        """(B, 1, T), the key mask of patch sequences (padding keys False), or None for images."""
        mask = self.token_mask(images)
        return None if mask is None else ops.expand_dims(mask, 1)

    def feature_grid(self, images, training=None):
        """The last block's patch features, normalized as `forward_features` gives them, as a grid
        (B, h, w, D): `forward_intermediates(images, indices=1, norm=True)`'s."""
        return self.forward_intermediates(images, indices=1, norm=True, intermediates_only=True, training=training)[0]

    def forward_intermediates(self, images, indices=None, norm=False, output_format="NHWC",
                              return_prefix_tokens=False, intermediates_only=False, training=None):
        """Features of several blocks, for dense heads (timm's `forward_intermediates`).

        Args:
            images: (B, H, W, C), normalized.
            indices: None (every block), an int n (the last n blocks) or a sequence of block
                indices, negative ones counting from the end.
            norm: apply the final LayerNorm to each intermediate.
            output_format: "NHWC", grids (B, h, w, D); or "NLC", sequences (B, N, D).
            return_prefix_tokens: give (grid, prefix (B, R, D)) pairs, the prefix being the class
                token and the registers.
            intermediates_only: give the list alone, and stop after the last block asked for;
                otherwise all blocks run and the result is (final features (B, T, D), the list),
                the final features as `forward_features` gives them.

        No attention probabilities are materialized.
        """
        take = select_blocks(indices, self.num_layers)
        if output_format not in ("NHWC", "NLC"):
            raise ValueError(f"output_format={output_format!r} is not allowed; use 'NHWC' or 'NLC'")
        sequences = naflex.is_patch_sequence(images)
        if sequences and output_format == "NHWC":
            raise ValueError("output_format='NHWC' needs one grid for the batch, and patch sequences have one per "
                             "image; use 'NLC' (and patch_coord to place each token)")
        p, grid = self.num_prefix_tokens, None if sequences else self.token_grid(images)
        x, out = self.embed_tokens(images, training=training), []
        for index, x, _ in self.encoder.iterate(x, last=max(take) if intermediates_only else None, training=training,
                                                attention_mask=self.attention_mask(images)):
            if index in take:
                y = self.encoder.norm_output(x) if norm else x
                grids = y[:, p:] if output_format == "NLC" else self.patch_grid(y, grid)  # (B, T, D) -> (B, h, w, D)
                out.append((grids, y[:, :p]) if return_prefix_tokens else grids)
        return out if intermediates_only else (self.encoder.norm_output(x), out)

    def as_backbone(self, indices=None, norm=False):
        """A `keras.Model` from images to the list of grids (B, h, w, D) of the blocks `indices`
        (as `forward_intermediates`), sharing this model's weights, for a user's functional model.
        Its input is (None, None, C) with `dynamic_image_size`, else (H, W, C) of `image_size`.
        It saves and loads within the user's `.keras` file (`keras_vit.models.ViTFeatures`)."""
        from keras_vit.models.backbone import as_backbone  # it builds on this module

        return as_backbone(self, indices, norm)

    def forward_head(self, features, token_mask=None):
        """The head on `forward_features`' output (B, T, D): logits in float32; `token_mask`
        (B, T), False for padding (`token_mask(images)`), which pooling leaves out."""
        return ops.cast(self.head(features, token_mask=token_mask), "float32")

    def __call__(self, images, *args, **kwargs):
        # Patch sequences are checked before Keras' `__call__`, which would wrap an error raised in
        # `call` in lines of context: bad input gets its one line.
        if naflex.is_patch_sequence(images):
            self.check_patch_sequences(images)
        return super().__call__(images, *args, **kwargs)

    def call(self, images, training=None):
        return self.forward_head(self.forward_features(images, training=training), self.token_mask(images))

    def normalize(self, pixels):
        """Maps pixels in [0, 255] (any real dtype), shape (..., C), to the model's input range
        (`Preprocessing.normalize` of `self.preprocessing`)."""
        return self.preprocessing.normalize(pixels)

    def compute_output_shape(self, input_shape):
        if isinstance(input_shape, dict):  # patch sequences: R + L tokens
            b, length = input_shape["patches"][:2]
            tokens = None if length is None else self.num_prefix_tokens + length
            return self.head.compute_output_shape((b, tokens, self.hidden_dim))
        h, w = self.grid_size
        if self.dynamic_image_size:
            h, w = (None if n is None else n // self.token_pixels for n in input_shape[1:3])
        tokens = None if h is None or w is None else self.num_prefix_tokens + h * w
        return self.head.compute_output_shape((input_shape[0], tokens, self.hidden_dim))

    def get_config(self):
        config = {"name": self.name, "trainable": self.trainable,
                  "dtype": upstream.serialize(self.dtype_policy)}
        for name in list(inspect.signature(ViT.__init__).parameters)[1:-1]:  # the arguments but self, kwargs
            config[name] = getattr(self, _ATTRIBUTES.get(name, name))
        config["head_initializer"] = upstream.serialize(self.head_initializer)
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        """`keras.Model.quantize`: the Dense and EinsumDense kernels in int8, int4 or float8.

        The attention then takes Keras' own path (three projections), which reads the quantized
        kernels with their scales. The model records what was quantized (its `quantization`
        argument), so its `.keras` file loads. "gptq" and "awq" are refused: Keras calibrates them
        on tokenized text. `save_checkpoint`, `export` and `enable_lora` take the float model.
        """
        mode = quantization_lib.check_mode(self, mode, config)
        with quantization_lib.quiet_unsupported_layers():
            super().quantize(mode, config=config, filters=filters, **kwargs)
        self.quantization = quantization_lib.record(self, mode, config)

    def enable_lora(self, rank, target_layer_names=None, train_head=True):
        """LoRA (Hu et al., 2022) of `rank` on the blocks' layers named in `target_layer_names`
        (default: "query" and "value"; also "key", "attention_output", "fc1", "fc2"), with Keras'
        `enable_lora`. The outputs are unchanged until training; every other weight is frozen, but
        the classifier head's when `train_head`. Returns the paths of the LoRA layers."""
        return lora.enable(self, rank, target_layer_names, train_head)

    def merge_lora(self):
        """A new ViT without LoRA whose kernels are the merged W + (alpha / r) A B, for
        `save_checkpoint`, `export` and serving."""
        return lora.merge(self, ViT)

    def save_lora_weights(self, path):
        """Writes the LoRA factors (and the head, when it trained with them) to the .safetensors
        `path`, without the base weights (see `load_lora_weights`)."""
        lora.save_weights(self, path)

    def load_lora_weights(self, path):
        """Loads factors written by `save_lora_weights` onto this (base) model, enabling LoRA with
        the file's rank and targets when it is not enabled yet."""
        lora.load_weights(self, path)

    def save(self, filepath, *args, **kwargs):
        """`keras.Model.save`, which also works when the weights are sharded over several hosts
        (multi-host JAX `ModelParallel`): then every process must call it, and each writes the
        whole model, gathered by `keras_vit.distribution.host_copy`."""
        if distribution.spans_processes(self):
            return distribution.host_copy(self).save(filepath, *args, **kwargs)
        return super().save(filepath, *args, **kwargs)

    def save_weights(self, filepath, *args, **kwargs):
        """`keras.Model.save_weights`, with the same multi-host handling as `save`."""
        if distribution.spans_processes(self):
            return distribution.host_copy(self).save_weights(filepath, *args, **kwargs)
        return super().save_weights(filepath, *args, **kwargs)

    @classmethod
    def from_preset(cls, name, **overrides):
        """A paper's architecture with random weights: "ViT-B/16" (any size Ti/S/B/L/H and patch
        size, or a name of `VARIANTS`). Trained weights load with `keras_vit.load`, from a path, a
        handle or a name of `keras_vit.list_pretrained()`.

        Args:
            name: an architecture name.
            **overrides: constructor arguments, e.g. `image_size=384` or `num_classes=10`.
        """
        if not is_architecture(name):
            raise ValueError(f"Unknown preset {name!r}. Known presets: {', '.join(PRESETS)} (any patch size); "
                             f"a checkpoint, handle or catalog name loads with keras_vit.load({name!r})")
        config = preset_config(name)
        config.update(preset=name)
        config.update(overrides)
        return cls(**config)


# Constructor arguments kept under another attribute name.
_ATTRIBUTES = {"position_embedding": "position_embedding_kind", "stem": "stem_kind"}


def _check_positive(name, value, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        allowed = "a non-negative integer" if allow_zero else "a positive integer"
        raise ValueError(f"{name}={value!r} is not allowed; use {allowed}")
    return value


def _check_pair(name, value):
    pair = (value, value) if isinstance(value, int) else tuple(value) if isinstance(value, (tuple, list)) else None
    if pair is None or len(pair) != 2:
        raise ValueError(f"{name}={value!r} is not allowed; use an int or a pair (H, W)")
    return tuple(_check_positive(name, int(v) if not isinstance(v, bool) and float(v).is_integer() else v)
                 for v in pair)


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not allowed; use one of {choices}")


def _channels(name, value, num_channels):
    values = (0.5,) * num_channels if value is None else tuple(float(v) for v in value)
    if len(values) != num_channels:
        raise ValueError(f"{name}={value!r} has {len(values)} values; num_channels={num_channels} needs that many")
    return values
