# Declarations of fastaccum._cy.scan_chunk: an ordinary vLLM chunk read straight from its bytes.

from fastaccum._cy.buffers cimport Buffer
from fastaccum._cy.fields cimport Event


cdef int scan_chunk(const unsigned char* base, Py_ssize_t n, Buffer out_ids, Buffer lp_ids, Buffer lp_values,
                    Event* r) except -1
