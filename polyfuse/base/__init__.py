"""What every layer needs and nothing else: errors, decision records, the visitor base,
settings and the on-disk store.

The layers (``polyfuse.graph``, ``polyfuse.poly``, ``polyfuse.stitch``, ``polyfuse.cuda``) and the
facade import these modules; this package imports no layer and no facade module
(``tests/test_import_graph.py`` holds the table). Its modules use the standard library only.
"""
