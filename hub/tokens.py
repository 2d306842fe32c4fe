"""Hugging Face access tokens, kept in the hub's own token storage (never in dgchat's files).

`store_token()` checks the token with the hub's whoami-v2 (`HfApi(endpoint=...).whoami`), then
saves it exactly as `huggingface_hub.login(token=..., add_to_git_credential=False)` does: under its
display name in `stored_tokens` and as the active token in `HF_TOKEN_PATH` (~/.cache/huggingface/
token), file mode 0600. It uses login's two lower-level helpers instead of login() itself because
login() validates against the endpoint fixed when huggingface_hub was imported, while dgchat
passes the endpoint per call. Every other huggingface_hub tool then sees the same token.
"""

from __future__ import annotations

from dataclasses import dataclass

from dgchat.hub.errors import HubError
from dgchat.hub.offline import hub_network
from dgchat.hub.remote import hub_endpoint


@dataclass(frozen=True)
class TokenInfo:
    user: str | None  # the account, when validated
    token_name: str  # the name it is stored under
    validated: bool


def stored_token() -> str | None:
    """The token huggingface_hub would send: HF_TOKEN, else the stored login. No network."""
    from huggingface_hub import get_token

    return get_token()


def store_token(token: str, *, endpoint: str | None = None, validate: bool = True) -> TokenInfo:
    """Validate `token` against the hub (unless validate=False) and store it as the active token."""
    import httpx2
    from huggingface_hub import HfApi
    from huggingface_hub import errors as hf

    token = (token or "").strip()
    if not token:
        raise HubError("no token given")
    if any(c.isspace() for c in token):
        raise HubError("a Hugging Face token has no spaces; paste it again")
    if token.startswith("api_org"):
        raise HubError("that is an organisation token; use a personal access token (huggingface.co/settings/tokens)")
    user = None
    name = "dgchat"
    if validate:
        base = hub_endpoint(endpoint)
        try:
            with hub_network():
                info = HfApi(endpoint=base).whoami(token=token)
        except hf.HfHubHTTPError as exc:
            status = getattr(exc.response, "status_code", None)
            if status == 401:
                raise HubError("the hub rejected this token (HTTP 401): check it at "
                               "huggingface.co/settings/tokens") from None
            raise HubError(f"could not check the token: the hub answered HTTP {status}") from None
        except (httpx2.TransportError, OSError) as exc:
            raise HubError(f"could not reach {base} to check the token: {exc}".splitlines()[0]) from None
        user = info.get("name")
        access = (info.get("auth") or {}).get("accessToken") or {}
        name = access.get("displayName") or (f"oauth-{user}" if user else "dgchat")
    _save(token, name)
    return TokenInfo(user=user, token_name=name, validated=validate)


def _save(token: str, name: str) -> None:
    try:
        from huggingface_hub._login import _set_active_token
        from huggingface_hub.utils._auth import _save_token
    except ImportError:  # pragma: no cover - a later huggingface_hub moved them: the public call
        from huggingface_hub import login

        with hub_network():
            login(token=token, add_to_git_credential=False)
        return
    _save_token(token=token, token_name=name)
    _set_active_token(token_name=name, add_to_git_credential=False)
