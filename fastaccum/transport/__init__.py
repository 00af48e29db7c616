"""The transports: ``Client`` and its HTTP/1.1 parts, ``GenerateStream`` on aiohttp, ``consume()``.
I/O and abort, nothing else; what a stream's bytes mean is the core's. The public names are
``fastaccum.Client``, ``fastaccum.GenerateStream`` and ``fastaccum.consume``; nothing is imported
here, so loading one transport never loads another's dependencies."""
