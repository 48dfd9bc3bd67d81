"""Editor support for ``.fuse`` rule files: a Pygments lexer, a TextMate grammar and a language server.

``autofusion.editors.pygments_lexer.FuseLexer`` needs Pygments; ``autofusion-lsp``
(:mod:`autofusion.editors.lsp`) needs pygls (``pip install autofusion[lsp]``). Nothing here is
imported by the rest of autofusion.
"""
