"""Why a gate opened: exact row / order / head attribution, ``explain()`` over a Pipeline, orders per token class."""
