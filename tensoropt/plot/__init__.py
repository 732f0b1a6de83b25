"""The interactive Pareto plot of a frontier.json: a self-contained HTML page and a local server.

The page's names are imported when first used (they load plotly); ``tensoropt.plot.details`` and the
other light modules (the command line's help reads their limits) do not.

Example:
    >>> from tensoropt.plot import write_pareto_html
    >>> # not run here: needs a frontier.json from `tensoropt plan`
    >>> write_pareto_html(json.load(open("out/frontier.json")), "out/pareto.html")  # doctest: +SKIP
"""

__all__ = ["pareto_html", "write_pareto_html"]


def __getattr__(name: str):
    if name in __all__:
        from tensoropt.plot import page

        return getattr(page, name)
    raise AttributeError(f"module 'tensoropt.plot' has no attribute {name!r}")
