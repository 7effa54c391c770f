"""Broker configuration: the keys this broker understands, read from Kafka `.properties` text
and command-line overrides, checked into the `BrokerConfig` every process runs with.

One role per module, each importing only those listed below it:
- load.py: `load_config`, raw pairs checked into `BrokerConfig` (what spans several keys);
- describe.py: the key table of `python -m broker --describe-config`;
- security.py: each TLS and SASL listener's settings (building a TLS context loads key stores);
- listeners.py: the listeners, their security protocols and what is set per listener;
- properties.py: `.properties` text and files, `--override` pairs, comma-separated values;
- keys.py: the key catalogue (`ServerProperties`: each key's type, default, bounds and doc)
  and `ConfigError`;
- values.py: a Kafka key's value checked as Kafka's ConfigDef checks it, for values clients
  set at run time (topic configs, dynamic broker keys).

The names the rest of the broker uses are re-exported here.
"""

from broker.shared.config.describe import describe_keys
from broker.shared.config.keys import (ConfigError, ServerProperties, declared_keys, key_doc,
                                       retention_ms)
from broker.shared.config.listeners import LISTENER_KEYS, Listener, listen_backlog
from broker.shared.config.load import BrokerConfig, load_config
from broker.shared.config.properties import parse_overrides, parse_properties, read_properties_file

__all__ = [
    "LISTENER_KEYS",
    "BrokerConfig",
    "ConfigError",
    "Listener",
    "ServerProperties",
    "declared_keys",
    "describe_keys",
    "key_doc",
    "listen_backlog",
    "load_config",
    "parse_overrides",
    "parse_properties",
    "read_properties_file",
    "retention_ms",
]
