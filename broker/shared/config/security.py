"""Each TLS and SASL listener's security settings: the broker-wide ssl.* and sasl.* keys, with
the listener's own listener.name.<l>.* keys winning.

A TLS listener's settings are checked by building its server context once
(broker.shared.tls): that reads its key store and trust store files, writes a key given inline
to a private temporary file to load it, and decrypts the key.  A SASL listener's PLAIN users
come from its JAAS config.  Every problem is a ConfigError naming the key.
"""

from __future__ import annotations

from broker.shared.config.keys import ConfigError, ServerProperties
from broker.shared.sasl import MECHANISMS, SASL_PROTOCOLS, SaslSettings, plain_users
from broker.shared.tls import (TLS_KEYS, TLS_PROTOCOLS, PrincipalRules, TlsConfigError, TlsSettings,
                               server_context)


def tls_settings(props: ServerProperties, per_listener: dict[str, dict[str, str]],
                 listeners) -> dict[str, TlsSettings]:
    """Every TLS listener's settings, each checked by building its context once."""
    names = {listener.name for listener in listeners}
    for name in per_listener:
        if name not in names:
            raise ConfigError(f"listener.name.{name.lower()}.ssl.*: listener {name} is not in "
                              "listeners")
    result = {}
    for listener in listeners:
        if listener.protocol not in TLS_PROTOCOLS:
            continue
        values = {key: getattr(props, key.replace(".", "_")) for key in TLS_KEYS}
        values = {key: value for key, value in values.items() if value}
        own = {key: value for key, value in per_listener.get(listener.name, {}).items()
               if key in TLS_KEYS}
        settings = TlsSettings(listener.name, {**values, **own}, frozenset(own))
        try:
            server_context(settings)
            PrincipalRules(settings.get("ssl.principal.mapping.rules", "DEFAULT"))
        except TlsConfigError as error:
            raise ConfigError(str(error)) from None
        except ValueError as error:
            raise ConfigError(f"{settings.name_of('ssl.principal.mapping.rules')}: "
                              f"{error}") from None
        result[listener.name] = settings
    return result


def sasl_settings(props: ServerProperties, per_listener: dict[str, dict[str, str]],
                  listeners) -> dict[str, SaslSettings]:
    """Every SASL listener's mechanisms and PLAIN users; a bad or missing key names itself."""
    result = {}
    for listener in listeners:
        if listener.protocol not in SASL_PROTOCOLS:
            continue
        own = per_listener.get(listener.name, {})
        prefix = f"listener.name.{listener.name.lower()}."
        key = "sasl.enabled.mechanisms"
        named = prefix + key if key in own else key
        mechanisms = tuple(item.strip().upper()
                           for item in own.get(key, props.sasl_enabled_mechanisms).split(",")
                           if item.strip())
        unknown = [item for item in mechanisms if item not in MECHANISMS]
        if unknown or not mechanisms:
            raise ConfigError(f"{named}: {', '.join(unknown) or 'nothing'} for SASL listener "
                              f"{listener.name} (supported: {', '.join(MECHANISMS)})")
        users = {}
        if "PLAIN" in mechanisms:
            jaas_key = prefix + "plain.sasl.jaas.config"
            if "plain.sasl.jaas.config" not in own:
                raise ConfigError(f"{jaas_key}: required for PLAIN on listener {listener.name}")
            try:
                users = plain_users(own["plain.sasl.jaas.config"])
            except ValueError as error:
                raise ConfigError(f"{jaas_key}: {error}") from None
        result[listener.name] = SaslSettings(listener.name, mechanisms, users)
    return result
