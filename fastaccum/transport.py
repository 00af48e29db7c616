"""Where ``fastaccum.Client`` lived before the transports were split by job: it is in
fastaccum.client now (its parts in fastaccum._http, fastaccum._pacing and fastaccum._timing); these
names stay importable from here."""

from fastaccum.client import DEFAULT_COALESCE_MS, Client, ClientStream

__all__ = ("Client", "ClientStream", "DEFAULT_COALESCE_MS")
