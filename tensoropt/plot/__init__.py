"""The interactive Pareto plot of a frontier.json: a self-contained HTML page and a local server.

Example:
    >>> from tensoropt.plot import write_pareto_html
    >>> # not run here: needs a frontier.json from `tensoropt plan`
    >>> write_pareto_html(json.load(open("out/frontier.json")), "out/pareto.html")  # doctest: +SKIP
"""

from tensoropt.plot.page import pareto_html, write_pareto_html

__all__ = ["pareto_html", "write_pareto_html"]
