"""A small marimo notebook that shows the gate view (run by tests/acceptance/test_browser.py with a
real ``marimo run`` server on 127.0.0.1): the prompt comparison of the embedded default model."""

import marimo

app = marimo.App()


@app.cell
def _():
    import marimo as mo

    from engram_viz.apps.widget import PromptComparison

    comparison = PromptComparison(("The Great Wall of China.", "The Small Wall of China."))
    mo.output.replace(mo.ui.anywidget(comparison.widget))  # the cell's output: the gate view


if __name__ == "__main__":
    app.run()
