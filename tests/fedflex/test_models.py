"""Tests for fedflex.models: shapes, hand-counted parameters, output layer, errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedflex import config, loader
from fedflex.config import ModelConfig
from fedflex.models import MODELS, build_model, num_parameters, output_bias_key, output_layer

# Each model on its natural input: (name, input_shape, num_classes)
NATURAL = [
    ("logreg", (60,), 10),  # FedProx Synthetic
    ("linear", (1, 28, 28), 10),  # churn paper, MNIST
    ("mlp", (1, 28, 28), 10),
    ("cnn-fmnist", (1, 28, 28), 10),  # HiCS-FL FMNIST
    ("cnn-fmnist-authors", (1, 28, 28), 10),  # HiCS-FL's public code, FMNIST
    ("cnn-bherd", (1, 28, 28), 10),  # BHerd MNIST
    ("cnn-cifar", (3, 32, 32), 10),  # FedAWARE / HiCS-FL CIFAR-10
    ("cnn-svhn", (3, 32, 32), 10),
    ("resnet18", (3, 32, 32), 10),
]
IDS = [name for name, _, _ in NATURAL]


def _build(name: str, shape: tuple[int, ...], classes: int = 10, **kw) -> nn.Module:
    return build_model(ModelConfig(name=name, **kw), shape, classes)


def test_registry_holds_exactly_the_config_model_names():
    assert set(MODELS) == set(config.MODELS)


@pytest.mark.parametrize("name,shape,classes", NATURAL, ids=IDS)
def test_output_has_shape_batch_by_classes(name, shape, classes):
    # Prepare
    torch.manual_seed(0)
    model = _build(name, shape, classes)
    x = torch.randn(3, *shape)
    # Execute
    out = model(x)
    # Assert
    assert out.shape == (3, classes)


@pytest.mark.parametrize(
    "name,shape,expected",
    [
        # Linear(60, 10): 60*10 + 10 = 610
        ("logreg", (60,), 610),
        # Linear(784, 10): 784*10 + 10 = 7850
        ("linear", (1, 28, 28), 7850),
        # Linear(784, 200): 156800 + 200 = 157000; Linear(200, 10): 2000 + 10 = 2010 -> 159010
        ("mlp", (1, 28, 28), 159010),
        # conv1 1*16*25+16 = 416; conv2 16*32*25+32 = 12832; fc 512*10+10 = 5130 -> 18378
        ("cnn-fmnist", (1, 28, 28), 18378),
        # conv 1*32*9 (no bias) = 288, PReLU 1, BN 2*32 = 64 -> 353; conv 32*32*9+32 = 9248,
        # PReLU 1, BN 64 -> 9313; conv 32*64*9+64 = 18496, PReLU 1, BN 128 -> 18625;
        # fc 64*7*7*64+64 = 200768; fc 64*10+10 = 650 -> 229709
        ("cnn-fmnist-authors", (1, 28, 28), 229709),
        # conv 1*32*25+32 = 832; conv 32*32*25+32 = 25632; fc 1568*256+256 = 401664;
        # fc 256*10+10 = 2570 -> 430698
        ("cnn-bherd", (1, 28, 28), 430698),
        # conv 3*32*9+32 = 896; conv 32*64*9+64 = 18496; conv 64*64*9+64 = 36928;
        # fc 1024*64+64 = 65600; fc 64*10+10 = 650 -> 122570
        ("cnn-cifar", (3, 32, 32), 122570),
        # conv 3*32*25+32 = 2432; conv 32*64*25+64 = 51264; fc 4096*512+512 = 2097664;
        # fc 512*10+10 = 5130 -> 2156490
        ("cnn-svhn", (3, 32, 32), 2156490),
        # torchvision ResNet-18 has 11689512 parameters with 1000 classes; 10 classes:
        # - 513*1000 + 513*10 -> 11181642; CIFAR stem conv1 3x3 instead of 7x7 (3*64 in->out):
        # - 3*64*49 + 3*64*9 = -9408 + 1728 -> 11173962
        ("resnet18", (3, 32, 32), 11173962),
    ],
    ids=[
        "logreg",
        "linear",
        "mlp",
        "cnn-fmnist",
        "cnn-fmnist-authors",
        "cnn-bherd",
        "cnn-cifar",
        "cnn-svhn",
        "resnet18",
    ],
)
def test_parameter_count_matches_hand_count(name, shape, expected):
    # Prepare / Execute
    model = _build(name, shape)
    # Assert
    assert num_parameters(model) == expected


def test_cnn_fmnist_computes_its_fc_size_for_32x32_colour_input():
    # 32 -> conv5 28 -> pool 14 -> conv5 10 -> pool 5: fc takes 32*5*5 = 800 features
    model = _build("cnn-fmnist", (3, 32, 32))
    out = model(torch.randn(2, 3, 32, 32))
    assert output_layer(model).in_features == 800
    assert out.shape == (2, 10)


def test_linear_rows_are_log_probabilities():
    # Prepare
    torch.manual_seed(0)
    model = _build("linear", (1, 28, 28))
    x = torch.randn(4, 1, 28, 28)
    # Execute
    out = model(x)
    # Assert: exp of each row sums to 1
    torch.testing.assert_close(out.exp().sum(dim=1), torch.ones(4))


@pytest.mark.parametrize("name,shape,classes", NATURAL, ids=IDS)
def test_output_layer_produces_the_model_output(name, shape, classes):
    # Prepare
    torch.manual_seed(0)
    model = _build(name, shape, classes).eval()
    layer = output_layer(model)
    seen = []
    layer.register_forward_hook(lambda mod, inp, out: seen.append(out))
    # Execute
    with torch.no_grad():
        out = model(torch.randn(2, *shape))
    # Assert: the layer ran once and its output is the model's (up to linear's log-softmax)
    assert isinstance(layer, nn.Linear) and layer.out_features == classes
    assert len(seen) == 1
    expected = torch.log_softmax(seen[0], dim=1) if name == "linear" else seen[0]
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("name,shape,classes", NATURAL, ids=IDS)
def test_output_bias_key_is_the_output_bias_in_state_dict(name, shape, classes):
    # Prepare
    model = _build(name, shape, classes)
    # Execute
    key = output_bias_key(model)
    state = model.state_dict()
    # Assert
    assert state[key].shape == (classes,)
    assert torch.equal(state[key], output_layer(model).bias.detach())


def test_output_bias_keys_are_fc_out_and_resnet_fc():
    assert output_bias_key(_build("cnn-fmnist", (1, 28, 28))) == "fc_out.bias"
    assert output_bias_key(_build("resnet18", (3, 32, 32))) == "fc.bias"


def test_output_layer_of_a_model_without_one_raises():
    with pytest.raises(ValueError, match="classification layer"):
        output_layer(nn.Sequential(nn.Flatten(), nn.Linear(4, 2)))


def test_resnet18_group_norm_has_no_batch_norm():
    model = _build("resnet18", (3, 32, 32), norm="group")
    kinds = {type(m) for m in model.modules()}
    assert nn.GroupNorm in kinds
    assert not any(issubclass(k, nn.modules.batchnorm._BatchNorm) for k in kinds)


def test_resnet18_batch_norm_has_batch_norm():
    model = _build("resnet18", (3, 32, 32), norm="batch")
    kinds = {type(m) for m in model.modules()}
    assert nn.BatchNorm2d in kinds
    assert nn.GroupNorm not in kinds


def test_resnet18_group_norm_uses_two_groups():
    model = _build("resnet18", (3, 32, 32), norm="group")
    groups = {m.num_groups for m in model.modules() if isinstance(m, nn.GroupNorm)}
    assert groups == {2}


def test_resnet18_small_input_gets_cifar_stem_with_input_channels():
    # 1x28x28 (MNIST): sides <= 32 -> 3x3 stride-1 conv1 on 1 channel, no max-pool
    model = _build("resnet18", (1, 28, 28))
    out = model(torch.randn(2, 1, 28, 28))
    assert (model.conv1.in_channels, model.conv1.kernel_size, model.conv1.stride) == (1, (3, 3), (1, 1))
    assert isinstance(model.maxpool, nn.Identity)
    assert out.shape == (2, 10)


def test_resnet18_large_input_keeps_imagenet_stem():
    model = _build("resnet18", (3, 64, 64))
    assert (model.conv1.kernel_size, model.conv1.stride) == ((7, 7), (2, 2))
    assert isinstance(model.maxpool, nn.MaxPool2d)


def test_unknown_name_raises_value_error_naming_it():
    with pytest.raises(ValueError, match="unknown model 'vgg16'"):
        _build("vgg16", (3, 32, 32))


def test_cnn_bherd_on_32x32_raises_naming_model_shape_and_need():
    with pytest.raises(ValueError) as err:
        _build("cnn-bherd", (3, 32, 32))
    message = str(err.value)
    assert "cnn-bherd" in message and "(3, 32, 32)" in message and "28" in message


def test_cnn_fmnist_below_smallest_side_raises():
    # 16 -> 12 -> 6 -> 2 -> 1 works; 15 -> 11 -> 5 -> 1 -> 0 does not
    _build("cnn-fmnist", (1, 16, 16))
    with pytest.raises(ValueError, match=r"cnn-fmnist.*\(1, 15, 15\).*H, W >= 16"):
        _build("cnn-fmnist", (1, 15, 15))


def test_cnn_cifar_below_smallest_side_raises():
    # 18 -> 16 -> 8 -> 6 -> 3 -> 1 works; 17 -> 15 -> 7 -> 5 -> 2 -> 0 does not
    _build("cnn-cifar", (3, 18, 18))
    with pytest.raises(ValueError, match=r"H, W >= 18"):
        _build("cnn-cifar", (3, 17, 17))


@pytest.mark.parametrize("name", ["cnn-fmnist", "cnn-bherd", "cnn-cifar", "cnn-svhn", "resnet18"])
def test_conv_model_on_a_vector_shape_raises(name):
    with pytest.raises(ValueError, match=rf"{name}.*\(60,\).*\(C, H, W\)"):
        _build(name, (60,))


def test_flattening_models_take_any_shape():
    # linear on 3x32x32: Linear(3072, 10) -> 30730 parameters
    model = _build("linear", (3, 32, 32))
    assert num_parameters(model) == 3072 * 10 + 10


def test_non_positive_num_classes_raises():
    with pytest.raises(ValueError, match="num_classes"):
        build_model(ModelConfig(name="logreg"), (60,), 0)


@pytest.mark.parametrize("name,shape,classes", NATURAL, ids=IDS)
def test_same_seed_builds_identical_models(name, shape, classes):
    # Prepare / Execute
    torch.manual_seed(0)
    first = _build(name, shape, classes).state_dict()
    torch.manual_seed(0)
    second = _build(name, shape, classes).state_dict()
    # Assert
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_mlp_with_a_list_of_widths_is_fedawares_784_200_200_10():
    # (784 * 200 + 200) + (200 * 200 + 200) + (200 * 10 + 10) = 157,000 + 40,200 + 2,010
    cfg = config.ModelConfig(name="mlp", hidden=[200, 200])
    model = build_model(cfg, (1, 28, 28), 10)
    assert sum(p.numel() for p in model.parameters()) == 199_210


def test_mlp_with_one_width_keeps_one_hidden_layer():
    # 784 * 50 + 50 + 50 * 10 + 10 = 39,200 + 50 + 500 + 10
    model = build_model(config.ModelConfig(name="mlp", hidden=50), (1, 28, 28), 10)
    assert sum(p.numel() for p in model.parameters()) == 39_760


@pytest.mark.parametrize("hidden", ["[]", "0", "[200,-1]", "abc"])
def test_mlp_widths_that_are_not_positive_integers_are_refused(hidden):
    with pytest.raises(config.ConfigError, match="model.hidden"):
        loader.load_scenario(None, ["model.name=mlp", f"model.hidden={hidden}"])
