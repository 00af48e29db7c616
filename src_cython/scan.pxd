# Declarations of fastaccum._cy.scan: an ordinary event read straight from its bytes.

from fastaccum._cy.buffers cimport Buffer
from fastaccum._cy.fields cimport Event


cdef int scan_event(const unsigned char* base, Py_ssize_t n, Buffer out_ids, Buffer lp_ids, Buffer lp_values,
                    Py_ssize_t skip, Event* r) except -1
