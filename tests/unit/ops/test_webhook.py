"""`alerts.webhook`: one Slack-compatible post when an alert starts and one when it ends, retried, bounded."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from ingest.config import AlertsConfig, WebhookConfig, parse_config
from ingest.errors import ConfigError
from ingest.ops.watch import Watcher
from ingest.ops.webhook import WebhookNotifier
from tests.unit.ops.recorder import Recorder, recording
from tests.unit.ops.test_watch import GB, Readings

HOOK = "/services/T0/B0/secret-token"


@pytest.fixture
def hook() -> Iterator[Recorder]:
    with recording() as server:
        yield server


def test_one_post_per_transition_not_per_poll(hook: Recorder) -> None:
    notifier = WebhookNotifier(WebhookConfig(url=hook.base + HOOK), backoff_s=0.01)
    slot = Readings()
    w = Watcher("hook_src", AlertsConfig(max_lag_bytes=GB), lambda: [], slot, notify=notifier.notify)
    w.poll()  # healthy: nothing to say
    slot.lag = 2 * GB
    for _ in range(5):  # the alert holds over five polls: one notice
        w.poll()
    slot.lag = 0
    w.poll()
    w.poll()
    notifier.close()
    texts = [p["text"] for p in hook.bodies(HOOK)]
    assert len(texts) == 2, texts
    assert "hook_src" in texts[0] and "slot_lag started" in texts[0] and "2,147,483,648 bytes" in texts[0]
    assert "hook_src" in texts[1] and "slot_lag cleared" in texts[1]


def test_a_failing_hook_is_retried_then_given_up(hook: Recorder, caplog: pytest.LogCaptureFixture) -> None:
    hook.fail = 2
    notifier = WebhookNotifier(WebhookConfig(url=hook.base + HOOK, retries=2), backoff_s=0.01)
    slot = Readings()
    slot.down = True
    w = Watcher("hook_retry", AlertsConfig(), lambda: [], slot, notify=notifier.notify)
    w.poll()
    hook.wait(lambda: bool(hook.posts))
    assert hook.requests == 3 and len(hook.posts) == 1  # two 500s, then delivered
    assert "source_unreachable started" in hook.bodies(HOOK)[0]["text"]

    hook.fail = 100  # down for good: 1 + retries attempts, then dropped, never raised
    caplog.set_level(logging.INFO, logger="ingest.ops.webhook")
    slot.down = False
    w.poll()
    notifier.close()
    assert hook.requests == 6
    assert any("notice dropped" in r.getMessage() for r in caplog.records)
    assert all("secret-token" not in r.getMessage() for r in caplog.records)  # the URL is a credential


def test_a_malformed_webhook_is_a_config_error_that_hides_the_url() -> None:
    base = "sources: [{kind: postgres, name: s, dsn: 'host=x', tables: [a.b]}]\n"
    with pytest.raises(ConfigError, match=r"alerts\.webhook\.url: .*http") as e:
        parse_config(base + "alerts: {webhook: {url: 'hooks.slack.com/services/T/B/tok3n'}}\n")
    assert "tok3n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"alerts\.webhook\.retries"):
        parse_config(base + "alerts: {webhook: {url: 'https://h/x', retries: -1}}\n")
    cfg = parse_config(base + "alerts: {webhook: {url: 'https://h/x', timeout_seconds: 2}}\n")
    assert cfg.alerts.webhook == WebhookConfig(url="https://h/x", timeout_seconds=2, retries=3)
