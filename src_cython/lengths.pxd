# Types for python/lengths.py, compiled as fastaccum._cy.lengths (the pure twin runs the same file
# as fastaccum._py.lengths): the compiled accumulator calls these as C functions, once per event.

import cython

cdef str AUTO, CUMULATIVE, INCREMENTAL

@cython.locals(reported=Py_ssize_t, cumulative_fits=bint, incremental_fits=bint, fits=bint)
cdef str event_mode(Py_ssize_t index, str mode, Py_ssize_t held, Py_ssize_t listed, Py_ssize_t logprobs_length,
                    Py_ssize_t completion_tokens, Py_ssize_t newest)
cdef int check_total(Py_ssize_t index, Py_ssize_t reported, Py_ssize_t newest) except -1
cdef int check_logprobs(Py_ssize_t index, object had, bint has) except -1
@cython.locals(replaces=bint)
cdef list text_after(list parts, str mode, bint echo, object text)
