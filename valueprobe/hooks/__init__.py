"""The one layer that touches ``nn.Module`` hooks: ``record`` / ``intervene`` handles and the routes
(plain hooks, nnsight, TransformerLens) behind one ``Route`` protocol."""
