"""The continuous rules' MQTT client (settings/rules.py, docs/rules.md): its login and topics.

The history job publishes each rule's rows through the broker as the client
``settings.rules.RULES_USER`` ("$rules"), QoS 1, like any other client: no bypass. The broker
knows that account by itself, whatever the [auth] section says:

* it logs in only with the password of ``<data_dir>/secrets/rules.password`` (made at the
  broker's start when missing, so the job finds it, when a job may run: with the Kafka sink, or
  rules to run; else read at the first CONNECT of that name, as the job may have made it); any
  other password is 0x86 Bad User Name or Password, also when anonymous clients are allowed and
  other names are not checked;
* it may PUBLISH only to the topics the rules name in ``publish`` (config and store rules,
  ``refresh()`` when the store changes), and SUBSCRIBE to nothing;
* a password file's or ACL's entry of that name is not used (the password file's is ignored
  with a warning).

Sans-I/O but for ``from_files`` / ``refresh``, which read the data directory.
"""
from __future__ import annotations

import hmac
import logging
import os
from typing import Iterable

from settings import rules as spec

log = logging.getLogger(__name__)

RULES_USER = spec.RULES_USER
BAD_USER_NAME_OR_PASSWORD = 0x86


class RulesAccount:
    def __init__(self, password: str | None, topics: Iterable[str] = ()) -> None:
        """password: the account's (None: nobody logs in as RULES_USER)."""
        self._password = password.encode("utf-8") if password else None
        self.topics: frozenset[str] = frozenset(topics)
        self.data_dir: str | None = None
        self.config_rules: tuple = ()

    @classmethod
    def from_files(cls, data_dir: str, config_rules: tuple | list = (),
                   job_may_run: bool = True) -> RulesAccount:
        """The account of a broker: its password (made when missing, if a job may run or rules
        exist) and the topics of the effective rules (a store that cannot be read: the
        config's, and an ERROR line). A plain broker (no sink, no rules) reads no file here."""
        has_store = os.path.exists(spec.store_path(data_dir))
        needed = job_may_run or bool(config_rules) or has_store
        account = cls(spec.password(data_dir, create=True) if needed else None)
        account.data_dir = data_dir
        account.config_rules = tuple(config_rules)
        if has_store:
            account.refresh()
        else:
            account.refresh(spec.Store())
        return account

    def refresh(self, store: spec.Store | None = None) -> None:
        """Re-read which topics the rules publish to (the store given, else its file)."""
        if store is None and self.data_dir is not None:
            try:
                store = spec.read_store(self.data_dir)
            except spec.RuleError as exc:
                log.error("rules: %s; the rules client may publish to the config's rules' "
                          "topics only", exc)
                store = spec.Store()
        rules = spec.effective(self.config_rules, store or spec.Store())
        self.topics = frozenset(spec.publish_topics(rules))

    def authenticate(self, password: bytes | None) -> int:
        """0, or 0x86 when the password is not the account's."""
        if self._password is None and self.data_dir is not None:
            made = spec.password(self.data_dir, create=False)  # by the job, since the start
            self._password = made.encode("utf-8") if made else None
        if self._password is None or password is None:
            return BAD_USER_NAME_OR_PASSWORD
        return 0 if hmac.compare_digest(bytes(password), self._password) \
            else BAD_USER_NAME_OR_PASSWORD

    def may_publish(self, topic: str) -> bool:
        return topic in self.topics
