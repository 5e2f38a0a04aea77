"""The tools file: both forms load into ToolSpecs; every mistake is a ConfigError naming
the file, the key, the value and the fix, all of them at once."""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.agents.tools import (
    ToolSpec,
    build_tools,
    load_tool_specs,
    parse_tool_specs,
    tool_schemas,
)
from engine.agents.tools.builtins import CalculatorTool, CodeInterpreterTool, FunctionTool
from engine.errors import ConfigError

SEARCH_PY = """
def search(query, limit=3):
    return f"{limit} results for {query}"

def helper():
    pass
"""

SEARCH_SCHEMA = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the notes.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query"],
        },
    },
}


def write(tmp_path, text, name="tools.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def problems(data, tmp_path=None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_tool_specs(data, source="t.yaml", base_dir=tmp_path)
    return info.value.problems


def test_verl_form_as_verl_users_write_it(tmp_path, fake_sandbox):
    """verl's sandbox-fusion example with the class named after rlctl's built-in."""
    path = write(
        tmp_path,
        """\
        tools:
          - class_name: "code_interpreter"
            config: {"wall_seconds": 5}
            tool_schema:
              type: "function"
              function:
                name: "code_interpreter"
                description: "A tool for executing code."
                parameters:
                  type: "object"
                  properties:
                    code:
                      type: "string"
                      description: "The code to execute."
                  required: ["code"]
        """,
    )
    (spec,) = load_tool_specs(path)
    assert spec == ToolSpec(
        name="code_interpreter",
        description="A tool for executing code.",
        parameters={
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code to execute."}},
            "required": ["code"],
        },
        builtin="code_interpreter",
        config={"wall_seconds": 5},
        where=f"{path}: tools[0]",
    )
    assert tool_schemas([spec]) == [
        {
            "type": "function",
            "function": {
                "name": "code_interpreter",
                "description": "A tool for executing code.",
                "parameters": spec.parameters,
            },
        }
    ]
    assert isinstance(build_tools([spec])["code_interpreter"], CodeInterpreterTool)


def test_verl_form_custom_function_and_renamed_builtin(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "my_tools.py").write_text(SEARCH_PY)
    data = {
        "tools": [
            {"class_name": "lib/my_tools.py:search", "tool_schema": SEARCH_SCHEMA},
            {
                "class_name": "calculator",
                "tool_schema": {
                    "type": "function",
                    "function": {
                        "name": "calc",
                        "description": "Arithmetic.",
                        "parameters": {
                            "type": "object",
                            "properties": {"expression": {"type": "string"}},
                            "required": ["expression"],
                        },
                    },
                },
            },
            {"class_name": "calculator"},  # no schema: the built-in's own
        ]
    }
    search, calc, default = parse_tool_specs(data, base_dir=tmp_path)
    assert (default.name, default.description, default.parameters) == (
        "calculator",
        CalculatorTool.DESCRIPTION,
        CalculatorTool.PARAMETERS,
    )
    assert search.path == str((tmp_path / "lib" / "my_tools.py").resolve())
    assert (search.function, search.builtin) == ("search", None)
    assert (calc.name, calc.builtin) == ("calc", "calculator")
    tools = build_tools([search, calc])
    assert type(tools["search"]) is FunctionTool
    assert isinstance(tools["calc"], CalculatorTool)
    assert tools["search"].schema == SEARCH_SCHEMA


def test_short_form(tmp_path):
    (tmp_path / "my_tools.py").write_text(SEARCH_PY)
    path = write(
        tmp_path,
        """\
        tools:
          - name: calculator
          - name: search
            path: my_tools.py
            description: Search the notes.
            parameters:
              type: object
              properties: {query: {type: string}, limit: {type: integer}}
              required: [query]
          - name: find
            path: my_tools.py
            function: search
            parameters: {type: object, properties: {query: {type: string}}, required: [query]}
        """,
    )
    calc, search, find = load_tool_specs(path)
    assert calc.builtin == "calculator"
    assert calc.parameters == CalculatorTool.PARAMETERS
    assert calc.description == CalculatorTool.DESCRIPTION
    assert tool_schemas([search]) == [SEARCH_SCHEMA]
    assert (find.function, find.description) == ("search", "")


def test_schemas_are_copies():
    (spec,) = parse_tool_specs({"tools": [{"name": "calculator"}]})
    spec.openai_schema()["function"]["parameters"]["properties"].clear()
    assert spec.openai_schema()["function"]["parameters"]["properties"]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(
            None, ["t.yaml: expected a mapping with a list under tools:"], id="empty file"
        ),
        pytest.param(
            {"tool": []}, ["expected a mapping with a list under tools:"], id="no tools key"
        ),
        pytest.param({"tools": []}, ["t.yaml: tools: is empty"], id="no tools"),
        pytest.param(
            {"tools": [{"name": "calculator"}], "tool": 1},
            ["t.yaml: unknown key 'tool' (did you mean 'tools'?)"],
            id="unknown top key",
        ),
        pytest.param(
            {"tools": ["calculator"]}, ["t.yaml: tools[0]: expected a mapping"], id="entry a string"
        ),
        pytest.param(
            {"tools": [{"config": {}}]},
            ["tools[0]: give class_name: and tool_schema:"],
            id="neither form",
        ),
        pytest.param(
            {"tools": [{"name": "calculater"}]},
            [
                "t.yaml: tools[0].name: unknown built-in tool 'calculater'",
                "did you mean 'calculator'?",
                "path:",
            ],
            id="unknown built-in",
        ),
        pytest.param(
            {"tools": [{"class_name": "code_interpeter"}]},
            [
                "tools[0].class_name: unknown built-in tool 'code_interpeter'",
                "did you mean 'code_interpreter'?",
            ],
            id="unknown built-in, verl form",
        ),
        pytest.param(
            {
                "tools": [
                    {
                        "class_name": "verl.tools.sandbox_fusion_tools.SandboxFusionTool",
                        "tool_schema": SEARCH_SCHEMA,
                    }
                ]
            },
            [
                "tools[0].class_name: 'verl.tools.sandbox_fusion_tools.SandboxFusionTool' is a Python class",
                "the built-in 'code_interpreter'",
            ],
            id="verl class",
        ),
        pytest.param(
            {"tools": [{"class_name": "my_tools.py:search"}]},
            [
                "t.yaml: tools[0]: a custom tool needs tool_schema: {type: function, function: {name,"
            ],
            id="custom tool without a schema",
        ),
        pytest.param(
            {"tools": [{"class_name": "my_tools.py", "tool_schema": SEARCH_SCHEMA}]},
            [
                "tools[0].class_name: 'my_tools.py': name the function too, as my_tools.py:function_name"
            ],
            id="custom file without a function",
        ),
        pytest.param(
            {"tools": [{"class_name": "calculator", "tool_shema": {}}]},
            ["t.yaml: tools[0]: unknown key 'tool_shema' (did you mean 'tool_schema'?)"],
            id="typo in a key",
        ),
        pytest.param(
            {
                "tools": [
                    {
                        "class_name": "calculator",
                        "tool_schema": {
                            "type": "function",
                            "function": {"name": "c", "paramters": {}},
                        },
                    }
                ]
            },
            ["tools[0].tool_schema.function: unknown key 'paramters' (did you mean 'parameters'?)"],
            id="typo in the function",
        ),
        pytest.param(
            {
                "tools": [
                    {
                        "class_name": "calculator",
                        "tool_schema": {"type": "retrieval", "function": {"name": "c"}},
                    }
                ]
            },
            ["tools[0].tool_schema.type: 'retrieval'; write type: function"],
            id="schema type",
        ),
        pytest.param(
            {
                "tools": [
                    {
                        "class_name": "calculator",
                        "tool_schema": {"type": "function", "function": "calc"},
                    }
                ]
            },
            ["tools[0].tool_schema.function: expected a mapping"],
            id="function not a mapping",
        ),
        pytest.param(
            {"tools": [{"class_name": "calculator", "tool_schema": "calc"}]},
            ["tools[0].tool_schema: expected a mapping"],
            id="schema not a mapping",
        ),
        pytest.param(
            {"tools": [{"name": "calculator", "parameters": {"type": "array"}}]},
            ["tools[0].parameters.type: 'array'", "write type: object"],
            id="not an object schema",
        ),
        pytest.param(
            {"tools": [{"name": "calculator", "parameters": "expression: string"}]},
            ["tools[0].parameters: expected a JSON Schema object"],
            id="schema a string",
        ),
        pytest.param(
            {
                "tools": [
                    {
                        "name": "calculator",
                        "parameters": {
                            "type": "object",
                            "properties": {"expression": {"type": "strin"}},
                        },
                    }
                ]
            },
            [
                "tools[0].parameters.properties.expression.type: 'strin' is not valid",
                "JSON Schema's types: string,",
            ],
            id="schema does not parse",
        ),
        pytest.param(
            {
                "tools": [
                    {
                        "name": "calculator",
                        "parameters": {
                            "type": "object",
                            "properties": {"expression": {"type": "string"}},
                            "required": ["expresion"],
                        },
                    }
                ]
            },
            ["tools[0].parameters.required: 'expresion' not under properties"],
            id="required not declared",
        ),
        pytest.param(
            {
                "tools": [
                    {
                        "name": "calculator",
                        "parameters": {
                            "type": "object",
                            "properties": {"expr": {"type": "string"}},
                        },
                    }
                ]
            },
            ["tools[0].parameters.properties: the built-in 'calculator' reads 'expression'"],
            id="built-in argument not declared",
        ),
        pytest.param(
            {"tools": [{"name": "calculator", "config": {"precision": 3}}]},
            ["tools[0].config.precision: the built-in 'calculator' takes no options"],
            id="config the built-in does not take",
        ),
        pytest.param(
            {"tools": [{"name": "calculator", "config": [1]}]},
            ["tools[0].config: expected a mapping of options"],
            id="config not a mapping",
        ),
        pytest.param(
            {
                "tools": [
                    {
                        "class_name": "calculator",
                        "tool_schema": {"type": "function", "function": {"name": "my calc"}},
                    }
                ]
            },
            ["tools[0].tool_schema.function.name: 'my calc'; a tool name is 1-64 letters"],
            id="bad tool name",
        ),
        pytest.param(
            {"tools": [{"name": "calculator", "description": ["x"]}]},
            ["tools[0].description: expected text"],
            id="description not text",
        ),
        pytest.param(
            {"tools": [{"name": "calculator", "function": "calc"}]},
            ["tools[0].function: set only with path:"],
            id="function without path",
        ),
        pytest.param(
            {"tools": [{"name": "calculator"}, {"name": "calculator"}]},
            ["t.yaml: tools[1]: tool name 'calculator' is declared twice (also at tools[0])"],
            id="duplicate names",
        ),
    ],
)
def test_problems_name_the_key_the_value_and_the_fix(data, expected):
    (message,) = problems(data)
    for part in expected:
        assert part in message, message


def test_a_bad_class_name_does_not_hide_a_bad_schema():
    schema = {"type": "function", "function": {"name": "run", "parameters": {"type": "objct"}}}
    found = problems({"tools": [{"class_name": "verl.X", "tool_schema": schema}]})
    assert [p.split(": ")[1] for p in found] == [
        "tools[0].class_name",
        "tools[0].tool_schema.function.parameters.type",
    ]


def test_every_problem_at_once():
    found = problems(
        {
            "tools": [
                {"name": "calculater"},
                {"class_name": "x.Y"},
                {"name": "calculator", "config": {"a": 1}},
            ]
        }
    )
    assert [p.split(":")[1].strip() for p in found] == [
        "tools[0].name",
        "tools[1].class_name",
        "tools[2].config.a",
    ]


def test_custom_tool_file_problems(tmp_path):
    (tmp_path / "my_tools.py").write_text(SEARCH_PY)
    (tmp_path / "broken.py").write_text("import not_a_module_anywhere\n")
    schema = SEARCH_SCHEMA["function"]["parameters"]
    found = problems(
        {
            "tools": [
                {"name": "a", "path": "missing.py", "parameters": schema},
                {"name": "b", "path": "my_tools.py", "function": "serch", "parameters": schema},
                {"class_name": "my_tools.py:nope", "tool_schema": SEARCH_SCHEMA},
                {"name": "c", "path": "broken.py"},
                {
                    "name": "search",
                    "path": "my_tools.py",
                    "parameters": {
                        "type": "object",
                        "properties": {"query": {"type": "string"}, "page": {"type": "integer"}},
                        "required": ["query"],
                    },
                },
                {
                    "name": "search",
                    "path": "my_tools.py",
                    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
                },
                {"name": "helper", "path": "my_tools.py", "config": {"x": 1}},
                {"name": "d", "path": ["my_tools.py"]},
            ]
        },
        tmp_path,
    )
    expected = [
        "t.yaml: tools[0].path: 'missing.py' is not a file (looked for",
        "has no function 'serch' (set t.yaml: tools[1].function; callables in the file: helper, search)",
        "has no function 'nope' (set t.yaml: tools[2].class_name;",
        "importing t.yaml: tools[3].path",
        "t.yaml: tools[4].function: search(query, limit=3) takes no argument 'page' that the schema declares",
        "t.yaml: tools[5].function: search(query, limit=3) needs 'query', which the schema does not require",
        "t.yaml: tools[6].config: a custom tool takes no config",
        "t.yaml: tools[7].path: expected the path of a .py file",
    ]
    assert len(found) == len(expected), found
    for message, part in zip(found, expected, strict=True):
        assert part in message, message


def test_custom_function_with_kwargs_takes_any_declared_argument(tmp_path):
    (tmp_path / "t.py").write_text("def anything(**kwargs):\n    return kwargs\n")
    (spec,) = parse_tool_specs(
        {
            "tools": [
                {
                    "name": "anything",
                    "path": "t.py",
                    "parameters": {"type": "object", "properties": {"z": {}}},
                }
            ]
        },
        base_dir=tmp_path,
    )
    assert spec.function == "anything"


def test_file_problems(tmp_path):
    with pytest.raises(ConfigError, match=r"tools file '.*nope\.yaml' does not exist"):
        load_tool_specs(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not valid YAML"):
        load_tool_specs(write(tmp_path, "tools: [\n", "bad.yaml"))
    with pytest.raises(ConfigError, match=r"deep\.yaml: nested too deeply"):
        load_tool_specs(write(tmp_path, "[" * 5000, "deep.yaml"))


def test_code_interpreter_needs_the_sandbox(no_sandbox):
    (message,) = problems({"tools": [{"name": "code_interpreter"}]})
    assert "tools[0]: the built-in 'code_interpreter' cannot run here" in message
    assert "engine.agents.code_interpreter" in message


def test_code_interpreter_config_is_kept_for_the_sandbox(fake_sandbox):
    """Read as written here; checked against the sandbox's limits when the tool is built
    (test_tool_builtins.py)."""
    (spec,) = parse_tool_specs(
        {"tools": [{"name": "code_interpreter", "config": {"memory_bytes": 2**28}}]}
    )
    assert spec.config == {"memory_bytes": 2**28}
    assert spec.parameters["required"] == ["code"]


_KEYS = st.sampled_from(
    [
        "tools", "name", "class_name", "config", "tool_schema", "type", "function",
        "description", "parameters", "properties", "required", "path", "items", "calculator",
    ]
)  # fmt: skip
_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.text(max_size=10),
    st.sampled_from(["calculator", "object", "function", "string", "x.py:f", "a.b.C", "m.py"]),
)
_DATA = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_KEYS, inner, max_size=5)),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.one_of(_DATA, st.builds(lambda t: {"tools": t}, st.lists(_DATA, max_size=3))))
def test_any_content_loads_or_is_a_config_error(data):
    try:
        specs = parse_tool_specs(data, source="t.yaml")
    except ConfigError as exc:
        assert exc.problems and all(p.startswith("t.yaml") for p in exc.problems), exc.problems
        return
    assert all(isinstance(spec, ToolSpec) for spec in specs)
