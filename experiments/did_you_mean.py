"""Suggestions for a misspelled name, wherever a user types one: a fab task or flag (Invoke says
only "No idea what 'x' is!"), a key of a spec table. The closest known name, if one is close.

A room of its own, light to import: the fabfile loads it for every `fab` command, `fab --list`
included, so pydantic is imported only when a spec's key is looked up."""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel


def hint(word: object, known: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest known name, or nothing."""
    names = {k.lstrip("-"): k for k in known}  # a flag's dashes are not what was misspelled
    close = difflib.get_close_matches(str(word).lstrip("-"), list(names), n=1, cutoff=0.6)
    return f" (did you mean {names[close[0]]!r}?)" if close else ""


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds, alone or in a list, optional or annotated."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def keys_at(model: type[BaseModel], loc: tuple[str | int, ...]) -> list[str]:
    """The keys the table at `loc` (a validation error's location, the unknown key last) may
    have: the fields of the model found by following loc's names from `model`."""
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        inner = _model_in(field.annotation) if field else None
        if inner is None:
            return []
        model = inner
    return list(model.model_fields)


def unknown_key(model: type[BaseModel], loc: tuple[str | int, ...]) -> str:
    return hint(loc[-1], keys_at(model, loc)) if loc else ""


_RENAMED: dict[tuple[str, str], str] = {}


def install_task_hints(renamed: Mapping[tuple[str, str], str] | None = None) -> None:
    """Invoke's "No idea what 'x' is!" for a task or flag, with the closest task or flag of the
    loaded collection (fab loads the fabfile, which calls this, before it parses tasks).
    renamed: {(task, old flag): new flag}, said instead of a guess where an old flag is used."""
    from invoke.exceptions import ParseError
    from invoke.program import Program

    _RENAMED.update(renamed or {})
    if getattr(Program.parse_tasks, "hinted", False):
        return
    parse_tasks = Program.parse_tasks

    def hinted_parse_tasks(self: Program) -> None:
        try:
            parse_tasks(self)
        except ParseError as err:
            text = str(err)
            prefix = "No idea what "
            if not text.startswith(prefix) or self.collection is None:
                raise
            word = text[len(prefix):].removesuffix(" is!").strip("'\"")
            context = getattr(err, "context", None)
            new = _RENAMED.get((getattr(context, "name", None) or "", word))
            if new is not None:
                raise ParseError(f"{text} ({word} is now {new}: `fab --help "
                                 f"{getattr(context, 'name', '')}`)", context) from None
            if word.startswith("-"):  # the flags of the task it came after, and fab's own
                known = [*(context.flags if context is not None else []),
                         *self.initial_context.flags]
            else:
                known = list(self.collection.task_names)
                for aliases in self.collection.task_names.values():
                    known += aliases
            known = [k for k in known if k != word]
            raise ParseError(f"{text}{hint(word, known)} (`fab --list` lists the tasks, "
                             "`fab --help TASK` a task's flags)", context) from None

    hinted_parse_tasks.hinted = True  # type: ignore[attr-defined]
    Program.parse_tasks = hinted_parse_tasks  # type: ignore[method-assign]
