"""Double of vime.utils.http_utils: the shared httpx client, get, post, get_rollout_num_engines."""

import httpx

_http_client = None


def get_rollout_num_engines(args):
    if (num := getattr(args, "rollout_num_engines", None)) is not None:
        return int(num)
    gpus = getattr(args, "rollout_num_gpus", None) or 0
    return max(1, gpus // (getattr(args, "rollout_num_gpus_per_engine", None) or 1)) if gpus > 0 else 0


def init_http_client(args):
    global _http_client
    if get_rollout_num_engines(args) <= 0:
        return
    if _http_client is None:
        _http_client = httpx.AsyncClient(timeout=httpx.Timeout(None), trust_env=False)


async def post(url, payload, max_retries=60, headers=None, timeout=None):
    kwargs = {"json": payload or {}, "headers": headers}
    if timeout is not None:
        kwargs["timeout"] = timeout
    response = await _http_client.post(url, **kwargs)
    response.raise_for_status()
    return response.json()


async def get(url, *, timeout=None):
    response = await _http_client.get(url, timeout=timeout)
    response.raise_for_status()
    return response.json()
