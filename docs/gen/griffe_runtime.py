"""A griffe extension for the API reference (mkdocs.yml: mkdocstrings' ``extensions``): what only the running code
knows, added to what griffe reads from the source.

The reference is read from the source (griffe's static analysis: members in source order, and the docstrings of
values, such as the dtypes', which only the source holds). flowlab also makes some functions when it is imported:
the elementwise and reduction ops (``add = _binary(Add)``: the function and its docstring come from a factory) and
``flow.config``'s OneFlow settings (made in a loop over a table). From the source those are a value without a
docstring, or nothing at all; this extension imports the module and puts in the functions themselves, with the
signature and docstring they have when running.
"""
import importlib
import inspect

import griffe



def _function(name, obj, lineno):
    """A griffe ``Function`` of the running function ``obj``: its signature and docstring."""
    parameters = []
    for p in inspect.signature(obj).parameters.values():
        default = None if p.default is inspect.Parameter.empty else repr(p.default)
        parameters.append(griffe.Parameter(p.name, kind=griffe.ParameterKind(p.kind.description), default=default))
    function = griffe.Function(name, parameters=griffe.Parameters(*parameters), lineno=lineno, endlineno=lineno)
    function.docstring = griffe.Docstring(inspect.cleandoc(obj.__doc__), parent=function)
    return function


def _modules(module):
    yield module
    for member in module.modules.values():
        if not member.is_alias:
            yield from _modules(member)


class RuntimeFunctions(griffe.Extension):
    def on_package(self, *, pkg, **kwargs):
        if pkg.path != "flowlab":            # dashboard/ makes nothing at import time; it is read as written
            return
        for module in _modules(pkg):
            try:
                running = importlib.import_module(module.path)
            except ImportError:
                continue
            last = max((m.lineno or 0 for m in module.members.values() if not m.is_alias), default=0)
            for name, member in list(module.members.items()):
                obj = getattr(running, name, None)
                # a value the source leaves undocumented that is a function when running: the function
                if not member.is_alias and member.is_attribute and member.docstring is None and \
                        inspect.isfunction(obj) and obj.__doc__:
                    module.set_member(name, _function(name, obj, member.lineno))
            for name in getattr(running, "__all__", ()):
                obj = getattr(running, name)
                # a public name the source does not show at all (made in a loop): the function, after the rest
                if name not in module.members and inspect.isfunction(obj) and obj.__doc__:
                    last += 1
                    module.set_member(name, _function(name, obj, last))
