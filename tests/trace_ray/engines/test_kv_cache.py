import torch
from transformers import DynamicCache

from trace_ray.engines.kv_cache import ROOM, RoomyLayer, roomy_cache


def test_updates_write_into_the_room_and_match_concatenation():
    torch.manual_seed(0)
    keys, values = torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4)
    layer = RoomyLayer.copy_of(keys, values, room=3)
    buffer = layer.keys.untyped_storage().data_ptr()
    expected_keys, expected_values = keys, values
    for step in range(5):
        new_keys, new_values = torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 4)
        got_keys, got_values = layer.update(new_keys, new_values)
        expected_keys = torch.cat([expected_keys, new_keys], dim=2)
        expected_values = torch.cat([expected_values, new_values], dim=2)
        assert torch.equal(got_keys, expected_keys) and torch.equal(got_values, expected_values)
        moved = layer.keys.untyped_storage().data_ptr() != buffer
        assert moved == (step >= 3)  # three steps fit the room; the fourth grows the buffer (by ROOM more)
    assert layer.get_seq_length() == 10 and layer._keys.buffer.shape[2] == 10 + ROOM - 1


def test_dropping_left_columns_and_selecting_rows_keep_the_values_and_the_room():
    torch.manual_seed(1)
    keys, values = torch.randn(4, 2, 6, 4), torch.randn(4, 2, 6, 4)
    layer = RoomyLayer.copy_of(keys, values, room=8)
    layer.drop_left(2)
    assert torch.equal(layer.keys, keys[:, :, 2:]) and layer.get_seq_length() == 4
    layer.batch_select_indices(torch.tensor([0, 3]))
    assert torch.equal(layer.values, values[[0, 3], :, 2:])
    buffer = layer.keys.untyped_storage().data_ptr()
    layer.update(torch.ones(2, 2, 1, 4), torch.ones(2, 2, 1, 4))
    assert layer.keys.untyped_storage().data_ptr() == buffer and torch.equal(layer.keys[:, :, -1], torch.ones(2, 2, 4))


def test_assigning_keys_replaces_them_as_a_dynamic_layer_does():
    layer = RoomyLayer.copy_of(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))
    layer.keys, layer.values = torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2)
    assert layer.get_seq_length() == 3
    layer.update(torch.ones(1, 1, 1, 2), torch.ones(1, 1, 1, 2))
    assert layer.get_seq_length() == 4


def test_a_model_gives_the_same_logits_with_a_roomy_cache(tiny_model):
    network, _ = tiny_model
    torch.manual_seed(2)
    prompt = torch.randint(0, network.config.vocab_size, (2, 9))
    with torch.no_grad():
        plain = network(input_ids=prompt, past_key_values=DynamicCache(), use_cache=True)
        roomy = network(input_ids=prompt, past_key_values=roomy_cache(), use_cache=True)
        assert all(isinstance(layer, RoomyLayer) for layer in roomy.past_key_values.layers)
        assert torch.equal(plain.logits, roomy.logits)
        for _ in range(4):
            token = plain.logits[:, -1:].argmax(-1)
            plain = network(input_ids=token, past_key_values=plain.past_key_values, use_cache=True)
            roomy = network(input_ids=token, past_key_values=roomy.past_key_values, use_cache=True)
            assert torch.equal(plain.logits, roomy.logits)
