#!/usr/bin/env python3
"""Regenerates jinja_cases.json: small templates rendered by Python's Jinja2 configured as
transformers' apply_chat_template configures it (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loopcontrols, json.dumps-style tojson, raise_exception). test_chat_template.cpp
checks that oscar's interpreter renders each one to the same string, or fails where Jinja fails.

Usage: python3 tests/chat_template/gen_jinja_cases.py  (needs jinja2; writes next to itself)
       python3 tests/chat_template/gen_jinja_cases.py --random 300 2026 \
           tests/chat_template/jinja_random_cases.json   (the committed random regression set)
       python3 tests/chat_template/gen_jinja_cases.py --random N SEED OUT.json
         writes N random templates (whitespace control, expressions) for a one-off differential
         run: OSCAR_JINJA_CASES=OUT.json build/tests/chat_template/test_chat_template
"""
import json
import os
import random
import sys

import jinja2
from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def make_env(**flags):
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    opts = dict(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    opts.update(flags)
    env = ImmutableSandboxedEnvironment(**opts)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


MSGS = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello", "tool_calls": [{"name": "f", "arguments": {"b": 1, "a": [1, 2.5, None, True]}}]},
]

# (template, context); contexts default to {}.
CASES = [
    # whitespace control and lstrip/trim
    ("a  {{- 'b' -}}  c", {}),
    ("a\n  {%- if true %}\nx\n  {%- endif %}\nb", {}),
    ("  {% if true %}\n    x\n  {% endif %}\nend", {}),
    ("{% if true %}  x  {% endif %}|", {}),
    ("line1\n  {# comment #}\nline2", {}),
    ("a {#- c -#} b", {}),
    ("{{ 'x' }}  {% if true %}y{% endif %}", {}),
    ("  {%+ if true %}x{% endif %}", {}),
    ("{% if true +%}\nx{% endif %}", {}),
    ("text\n", {}),
    ("text\n\n", {}),
    ("a\r\nb\rc", {}),
    ("{% raw %}{{ not evaluated }}{% endraw %}", {}),
    ("  {%- raw -%}  {{x}}  {%- endraw -%}  |", {}),
    # output of values
    ("{{ 1 }} {{ 1.0 }} {{ 2.5e-7 }} {{ 1e20 }} {{ 0.1 + 0.2 }} {{ -0.0 }}", {}),
    ("{{ true }} {{ none }} {{ [1, 'a', none, true] }} {{ {'k': 'v', 'n': 1} }}", {}),
    ("{{ \"it's\" }} {{ ['it\\'s', 'q\"'] }} {{ ['a\\nb'] }}", {}),
    ("{{ x }}|{{ d.missing }}|{{ d.missing is defined }}|{{ x is defined }}", {"d": {}}),
    ("{{ 'a' ~ 1 ~ none ~ undefined_var }}", {}),
    ("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }}", {}),
    ("{{ 1 + 2 * 3 - 4 }} {{ (1 + 2) * 3 }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1] + [2] }}", {}),
    ("{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}", {}),
    ("{{ 'a' in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }}", {}),
    ("{{ 0 or 'x' }} {{ 1 and 'y' }} {{ '' and 'z' }} {{ not none }}", {}),
    ("{{ 'yes' if x else 'no' }} {{ 'a' if true }}|{{ 'b' if false }}|", {"x": [0]}),
    ("{{ -x }} {{ +x }} {{ - 2 ** 2 }}", {"x": 3}),
    # literals and escapes
    ("{{ 'tab\\there' }}|{{ \"nl\\nx\" }}|{{ 'u\\u00e9' }}|{{ 'back\\\\slash' }}|{{ 'keep\\d' }}", {}),
    ("{{ 'a' 'b' }} {{ (1, 2) }} {{ () }} {{ [] }} {{ {} }} {{ 1_000 }}", {}),
    # attribute / item access, slicing
    ("{{ m[0].role }} {{ m[-1]['content'] }} {{ m.0.content }} {{ m[5] is defined }}", {"m": MSGS}),
    ("{{ s[1:3] }}|{{ s[::-1] }}|{{ s[-2:] }}|{{ s[:-1] }}|{{ s[::2] }}|{{ s[10:] }}", {"s": "héllo"}),
    ("{{ l[1:] }} {{ l[::-1] }} {{ l[-1] }} {{ l[1:-1] }} {{ l[::-2] }}", {"l": [1, 2, 3, 4]}),
    ("{{ s[0] }}{{ s[-1] }}{{ s|length }}", {"s": "日本語"}),
    ("{{ d['items'] }} {{ d.get('x', 'dflt') }} {{ d.get('a') }}", {"d": {"items": 5, "a": 1}}),
    # loops
    ("{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }},{% endfor %}", {"l": ["a", "b", "c"]}),
    ("{% for x in l if x > 1 %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% endfor %}", {"l": [1, 2, 3]}),
    ("{% for x in [] %}x{% else %}empty{% endfor %}", {}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}", {"d": {"z": 1, "a": 2}}),
    ("{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}{% for k, v in d|dictsort %}{{ k }}{% endfor %}", {"d": {"z": 1, "a": 2}}),
    ("{% for c in 'ab' %}[{{ c }}]{% endfor %}{% for x in undefined_thing %}x{% endfor %}", {}),
    ("{% for x in range(5) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("{% for x in l %}{{ loop.previtem }}-{{ loop.nextitem }} {{ loop.cycle('o', 'e') }};{% endfor %}", {"l": [1, 2, 3]}),
    ("{% for a in [1,2] %}{% for b in [3,4] %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}{% endfor %}", {}),
    ("{% for x in l|reverse %}{{ x }}{% endfor %} {{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }}", {"l": [1, 2, 3]}),
    # scoping and set
    ("{% set x = 1 %}{% for i in [1,2] %}{% set x = i * 10 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}", {}),
    ("{% set ns = namespace(total=0, items=[]) %}{% for i in [1,2,3] %}{% set ns.total = ns.total + i %}{% set ns.items = ns.items + [i] %}{% endfor %}{{ ns.total }} {{ ns.items }}", {}),
    ("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 3, 4 %}{{ t }}", {}),
    ("{% set block %}inner {{ 1 + 1 }}{% endset %}[{{ block }}]", {}),
    ("{% with y = 5 %}{{ y }}{% endwith %}[{{ y }}]", {}),
    # macros
    ("{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', greeting='Hi') }} {{ greet('C', 'Yo') }}", {}),
    ("{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(4) }}", {}),
    ("{% macro f() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ f(1, 2, k=3) }}", {}),
    ("{% set g = 'outer' %}{% macro m() %}{{ g }}{% endmacro %}{{ m() }}", {}),
    # filters
    ("{{ '  pad  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 'AbC'|lower }}{{ 'abc'|upper }}|{{ 'hello world'|title }}|{{ 'hELLO'|capitalize }}", {}),
    ("{{ l|length }} {{ l|count }} {{ 'abc'|length }} {{ d|length }} {{ l|first }} {{ l|last }} {{ l|join(', ') }} {{ l|join }}", {"l": [3, 1, 2], "d": {"a": 1}}),
    ("{{ l|sort }} {{ l|sort(reverse=true) }} {{ w|sort }} {{ w|sort(case_sensitive=true) }} {{ l|min }} {{ l|max }} {{ l|sum }}", {"l": [3, 1, 2], "w": ["b", "A", "c"]}),
    ("{{ x|default('d') }} {{ ''|default('e') }} {{ ''|default('f', true) }} {{ none|default('g') }} {{ x|d('h') }}", {}),
    ("{{ 'a-b-c'|replace('-', '+') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 1|string }}{{ [1]|string }}", {}),
    ("{{ m|map(attribute='role')|list }} {{ m|selectattr('role', 'equalto', 'user')|map(attribute='content')|join }} {{ m|rejectattr('role', 'eq', 'user')|list|length }}", {"m": MSGS}),
    ("{{ [1, 2, 3, 4]|select('even')|list }} {{ [1, 0, '', 'a']|select|list }} {{ [1, 2, 3]|reject('odd')|list }} {{ ['a', 'B']|map('upper')|list }}", {}),
    ("{{ m|selectattr('tool_calls')|list|length }} {{ m|selectattr('tool_calls', 'defined')|list|length }}", {"m": MSGS}),
    ("{{ [1, 2, 1, 3, 2]|unique|list }} {{ 'abc'|reverse }} {{ 'abc'|list }} {{ '42'|int + 1 }} {{ '3.5'|float }} {{ 'x'|int }} {{ 3.7|int }} {{ 2.5|round }} {{ 3.14159|round(2) }} {{ -5|abs }}", {}),
    ("{{ '<a href=\"x\">&</a>'|e }} {{ 'x'|safe }} {{ 'one two  three'|wordcount }} {{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}", {}),
    ("{{ m|tojson }}", {"m": MSGS}),
    ("{{ m[2]|tojson(indent=2) }}", {"m": MSGS}),
    ("{{ {'b': 1, 'a': 'é\\n\"'}|tojson }} {{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }} {{ 'é'|tojson(ensure_ascii=true) }} {{ [1.0, 1e100, -0.5]|tojson }}", {}),
    ("{{ d|dictsort }} {{ d|dictsort(by='value') }} {{ d|dictsort(reverse=true) }}", {"d": {"b": 2, "a": 3, "C": 1}}),
    ("{% filter upper %}shout {{ 'it' }}{% endfilter %}", {}),
    ("{{ l|first|upper }} {{ (l|last).content }}", {"l": ["x", {"content": "c"}]}),
    ("{{ m|attr('role') }}|{{ [1, [2]]|pprint }}", {"m": {"role": "r"}}),
    # tests
    ("{{ x is defined }} {{ y is undefined }} {{ none is none }} {{ 1 is number }} {{ 1 is integer }} {{ 1.0 is float }} {{ true is boolean }} {{ 'a' is string }}", {"x": 1}),
    ("{{ {} is mapping }} {{ [] is sequence }} {{ 'a' is sequence }} {{ {} is sequence }} {{ 1 is iterable }} {{ 'a' is iterable }} {{ x is iterable }}", {}),
    ("{{ false is false }} {{ 0 is false }} {{ true is true }} {{ 1 is true }} {{ x is not none }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(2) }}", {"x": None}),
    ("{{ 'a' is in 'cat' }} {{ 1 is eq 1 }} {{ 2 is gt 1 }} {{ 'ABC' is upper }} {{ 'abc' is lower }} {{ range is callable }}", {}),
    ("{{ x is string and x.startswith('a') }}", {"x": "abc"}),
    ("{{ (1,) }} {{ (1, 'a') == (1, 'a') }} {{ [(1, 2)]|first }} {{ ((1, 2), [3]) }}", {}),
    # string methods
    ("{{ s.startswith('he') }} {{ s.endswith(('x', 'lo')) }} {{ s.upper() }} {{ s.replace('l', 'L') }} {{ s.find('l') }} {{ s.rfind('l') }} {{ s.find('z') }} {{ s.count('l') }}", {"s": "hello"}),
    ("{{ s.split() }} {{ s.split(',') }} {{ s.split(',', 1) }} {{ s.rsplit(',', 1) }} {{ ' a  b '.split() }} {{ 'a b c'.split(none, 1) }}", {"s": "a,b,c"}),
    ("[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ 'xxhixx'.strip('x') }}][{{ '\\n\\nhi\\n'.lstrip('\\n') }}]", {"s": "  hi  "}),
    ("{{ '-'.join(['a', 'b']) }} {{ 'Hello World'.lower() }} {{ 'ab'.title() }} {{ 'abc'.capitalize() }} {{ '123'.isdigit() }} {{ 'ab1'.isalpha() }} {{ ' '.isspace() }}", {}),
    ("{{ 'a\\nb\\r\\nc'.splitlines() }} {{ 'prefix-x'.removeprefix('prefix-') }} {{ 'x.txt'.removesuffix('.txt') }}", {}),
    ("{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}", {"c": "<think>\nr\n</think>\n\nans"}),
    # dict methods and globals
    ("{{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {{ dict(a=1, b=2) }} {{ namespace(a=1).a }}", {"d": {"x": 1, "y": [2]}}),
    # misc
    ("{% if not x %}none{% elif x|length > 2 %}long{% else %}short{% endif %}", {"x": [1, 2, 3]}),
    ("{% if x %}a{% elif y %}b{% endif %}|", {"x": 0, "y": 0}),
    ("{{ x.content if x.content is string else x.content|map(attribute='text')|join }}", {"x": {"content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]}}),
    ("{{ messages[0]['content'] if messages[0]['role'] == 'system' else '' }}", {"messages": MSGS}),
    # scoping details
    ("{% for i in [1,2] %}{% if i == 2 %}[{{ x }}]{% endif %}{% set x = i %}{% endfor %}", {}),
    ("{% set x = 'o' %}{% for i in [1,2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}", {}),
    ("{% macro m() %}{{ y }}{% endmacro %}{% set y = 2 %}{{ m() }}", {}),
    ("{% for i in [1,2] %}{% set x = i %}{% endfor %}[{{ x }}]{% if true %}{% set z = 3 %}{% endif %}{{ z }}", {}),
    ("{% set ns = namespace(a=1) %}{{ ns is mapping }} {{ ns }} {{ ns.missing is defined }}", {}),
    ("{{ x.y }}|{{ none.y is defined }}|{{ (1, 2)|tojson }}|{{ 5|string + 'a' }}", {"x": None}),
    ("{% for m in msgs %}{{ loop.index }}{{ m }}{% endfor %}", {"msgs": {"a": 1, "b": 2}}),
    ("{{ x|trim }}|{{ x|upper }}|{{ x|string }}|{{ x|join }}|{{ x|list }}", {}),
    ("{{ 1.5|int }} {{ '0x1f'|int }} {{ '1e3'|int }} {{ true|int }} {{ ' 7 '|int }}", {}),
    ("{% for i in [1, 2] %}{% break %}{% else %}else-ran{% endfor %}|{% for i in [1] %}{% continue %}{% else %}else-ran{% endfor %}|{% for i in [1, 2] %}{% if i == 2 %}{% break %}{% endif %}{% else %}no{% endfor %}", {}),
    ("{% set v = 0 %}{% for i in [] %}{% else %}{% set v = 1 %}{% endfor %}{{ v }}", {}),
    ("{% set ns = namespace() %}{% set ns.self = ns %}{% set ns.l = [ns] %}{{ ns }}|{{ ns.l == ns.l }}", {}),
    # printf-style formatting
    ("{{ '%s-%d' % ('a', 3) }} {{ '%s' % 'x' }} {{ '%5.2f|%-4s|%04d|%x|%r' % (3.14159, 'ab', 7, 255, 'q') }} {{ '%(a)s!' % {'a': 1} }} {{ '100%%' % () }}", {}),
    # precedence and operators
    ("{{ l|length > 1 and l[0] == 1 }} {{ not l|length }} {{ -l|length }} {{ 'a' ~ l|length ~ 'b' }} {{ l|length * 2 + 1 }}", {"l": [1, 2]}),
    ("{{ 1 if x is defined else 2 }} {{ x is not defined }} {{ not x is defined }} {{ (y or {}).get('k', 'dk') }}", {}),
    ("{{ 'a' < 'B' }} {{ 'abc' >= 'abc' }} {{ [1] == [1] }} {{ {'a': 1} == {'a': 1} }} {{ none == none }} {{ 1 != '1' }}", {}),
    ("{{ '\\n' if not loop_last }}x{{- '\\n' if not true }}", {"loop_last": False}),
    # realistic template fragments
    ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content']|trim %}{% set rest = messages[1:] %}{% else %}{% set system = 'default system' %}{% set rest = messages %}{% endif %}"
     "<|system|>{{ system }}\n{% for m in rest %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('alternate!') }}{% endif %}"
     "<|{{ m['role'] }}|>{{ m['content']|trim }}{% if not loop.last %}\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}",
     {"bos_token": "<s>", "add_generation_prompt": True, "messages": [{"role": "system", "content": "  S  "}, {"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}]}),
    ("{% for message in messages %}\n    {%- if message.role == 'assistant' %}\n        {%- set role = 'model' %}\n    {%- else %}\n        {%- set role = message.role %}\n    {%- endif %}\n    {{- '<start_of_turn>' + role + '\\n' + message.content | trim + '<end_of_turn>\\n' }}\n{% endfor %}\n{% if add_generation_prompt %}\n    {{- '<start_of_turn>model\\n' }}\n{% endif %}\n",
     {"add_generation_prompt": True, "messages": [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo"}]}),
    ("{%- set ns = namespace(found=false) -%}\n{%- for message in messages -%}\n    {%- if message['role'] == 'system' -%}\n        {%- set ns.found = true -%}\n    {%- endif -%}\n{%- endfor -%}\n{%- if not ns.found -%}\n{{- '<|im_start|>system\\nDefault.<|im_end|>\\n' -}}\n{%- endif %}\n{%- for message in messages %}\n{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n{{- '<|im_start|>assistant\\n' -}}\n{%- endif -%}\n",
     {"add_generation_prompt": True, "messages": [{"role": "user", "content": "q"}]}),
    ("{%- if tools %}\n{%- for tool in tools %}\n{{- tool.function.name }}({% for name, p in tool.function.parameters.properties|items %}{{ name }}: {{ p.type }}{% if not loop.last %}, {% endif %}{% endfor %})\n{% endfor %}\n{%- endif %}\n{%- for m in messages %}\n  {%- if m.tool_calls is defined %}\n    {%- for tc in m.tool_calls %}\n[{{ tc.function.name }} {{ tc.function.arguments|tojson }}]\n    {%- endfor %}\n  {%- endif %}\n{%- endfor %}",
     {"tools": [{"type": "function", "function": {"name": "get", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}],
      "messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "get", "arguments": {"city": "Oslo", "days": 2}}}]}]}),
    ("{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for part in m.content %}{% if part.type == 'text' %}{{ part.text }}{% elif part.type == 'image' %}<img>{% endif %}{% endfor %}{% endif %}|{% endfor %}",
     {"messages": [{"role": "user", "content": "plain"}, {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]}]}),
    ("{%- macro render_params(props, indent) -%}\n{%- for k, v in props.items() %}\n{{ indent }}{{ k }}: {{ v.type }}{% if v.properties is defined %}\n{{ render_params(v.properties, indent ~ '  ') }}{% endif %}\n{%- endfor %}\n{%- endmacro -%}\n{{ render_params(schema, '') }}",
     {"schema": {"a": {"type": "object", "properties": {"b": {"type": "string"}, "c": {"type": "object", "properties": {"d": {"type": "number"}}}}}, "e": {"type": "boolean"}}}),
    # errors (Jinja raises; oscar must return an error too)
    ("{{ raise_exception('bad role') }}", {}),
    ("{{ x.y.z }}", {}),
    ("{{ d.missing.deeper }}", {"d": {}}),
    ("{{ 1 + 'a' }}", {}),
    ("{{ x + 1 }}", {}),
    ("{{ 'a' in none }}", {}),
    ("{% for x in 5 %}{% endfor %}", {}),
    ("{{ range(200000)|length }}", {}),
    ("{% if true %}unclosed", {}),
    ("{{ x|nosuchfilter }}", {}),
    ("{{ x is nosuchtest }}", {}),
    ("{% endif %}", {}),
    ("{{ 1 / 0 }}", {}),
    ("{{ 'abc'.nosuchmethod() }}", {}),
    ("{{ (1 }}", {}),
    ("{% include 'x.html' %}", {}),
    ("{% set x = 1 %}{% set x.y = 2 %}", {}),
    ("{{ undefined_var() }}", {}),
    ("{{ undefined_var|tojson }}", {}),
    ("{{ 'a' + 5 }}", {}),
    ("{{ 3 is divisibleby(0) }}", {}),
    ("{{ '%d' % 'x' }}", {}),
    ("{{ '%s %s' % ('a',) }}", {}),
    ("{% macro m() %}{{ loop.index }}{% endmacro %}{% for i in [1,2] %}{{ m() }}{% endfor %}", {}),
]


def random_cases(n, seed):
    rng = random.Random(seed)
    texts = ["", " ", "  ", "\n", "\n  ", "  \n", "a", "b\n", " c ", "\t", "\n\n", "x\n  y",
             "{", "}", "}}", "%}", "#}", "{ {", "\r\n", " \t\n "]
    def tag():
        kind = rng.choice(["var", "if", "for", "set", "comment", "raw"])
        l = rng.choice(["", "", "-", "+"])
        r = rng.choice(["", "", "-", "+"])
        if kind == "var":
            return "{{%s %s %s}}" % (l.replace("+", ""), rng.choice(["1", "'v'", "x", "none"]),
                                     r.replace("+", ""))
        if kind == "comment":
            return "{#%s c %s#}" % (l.replace("+", ""), r.replace("+", ""))
        if kind == "set":
            return "{%%%s set y = 2 %s%%}" % (l, r)
        if kind == "raw":
            return "{%%%s raw %s%%}%s{{ r }}%s{%%%s endraw %s%%}" % (
                l, r.replace("+", ""), rng.choice(texts), rng.choice(texts),
                rng.choice(["", "-"]), rng.choice(["", "-"]))
        inner = body(2)
        if kind == "if":
            return "{%%%s if x %s%%}%s{%%%s endif %s%%}" % (l, r, inner, rng.choice(["", "-", "+"]),
                                                        rng.choice(["", "-", "+"]))
        return "{%%%s for i in [1, 2] %s%%}%s{%%%s endfor %s%%}" % (
            l, r, inner, rng.choice(["", "-", "+"]), rng.choice(["", "-", "+"]))
    depth = [0]
    def body(k):
        depth[0] += 1
        parts = []
        for _ in range(rng.randint(0, k)):
            parts.append(rng.choice(texts))
            if depth[0] < 3:
                parts.append(tag())
        parts.append(rng.choice(texts))
        depth[0] -= 1
        return "".join(parts)
    atoms = ["1", "2.5", "-3", "'ab'", "\"c\"", "none", "true", "false", "x", "l", "d", "s",
             "[1, 'a']", "{'k': 1}", "(1, 2)", "undefined_name", "l[0]", "d.k", "s[1:]", "l|length",
             "s|upper", "d|tojson", "l|join('-')", "s.split('b')", "range(3)|list", "l|reverse|list",
             "u", "u[::-1]", "u[1:-1]", "u|length", "u.upper()", "u.split()", "u.strip(' h')",
             "u.replace('é', 'e')", "u.find('l')", "u.startswith('hé')", "u.endswith(('x', 'o '))",
             "u|title", "u|capitalize", "u|trim", "u|wordcount", "u|center(3)" if False else "u|first",
             "u|last", "u|list|length", "u|tojson", "m|map(attribute='r')|list",
             "m|selectattr('r', 'equalto', 'a')|list", "m|rejectattr('c')|map(attribute='r')|join(',')",
             "m|tojson", "m[0]", "m[1].c", "m[-1]['r']", "m|length", "m|first", "m|last",
             "m|sort(attribute='r')|map(attribute='r')|list", "m|unique(attribute='r')|list",
             "f", "'{}-{}-{k}'.format(1, 2, k=3)", "'{1}{0}{1}'.format('a', 'b')", "'{}{1}'.format(1, 2)", "'{{x}}'.format()", "f|round(1)", "f|int", "f * 2", "-f", "f|string",
             "l[::-2]", "l[5:]", "l|sort", "l|sum", "l|min", "l|max", "l|unique|list", "l|first",
             "l|select('odd')|list", "l|map('string')|join", "l|batch(2)|list", "d|dictsort",
             "d.items()|list", "d.keys()|list", "d|items|list", "d.get('k')", "d.get('z', 0)",
             "d['n']", "d.n is none", "d|length", "namespace(a=1).a", "dict(a=1)",
             "'%s|%5.1f' % (s, f)", "'a,b,,c'.split(',')", "'  x  y '.split()", "'x\\ny'",
             "'A'|lower", "s * 2", "[1] * 2", "'b' in s", "2 in l", "'k' in d", "s ~ 1 ~ none"]
    ops = [" + ", " - ", " * ", " / ", " // ", " % ", " ~ ", " == ", " != ", " < ", " >= ",
           " and ", " or ", " in ", " not in "]
    def expr(k):
        if k == 0 or rng.random() < 0.3:
            a = rng.choice(atoms)
            if rng.random() < 0.15:
                a = "not " + a
            if rng.random() < 0.15:
                a = a + rng.choice([" is defined", " is string", " is none", " is not number"])
            return a
        if rng.random() < 0.15:
            return "(%s if %s else %s)" % (expr(k - 1), expr(k - 1), expr(k - 1))
        return "(" + expr(k - 1) + rng.choice(ops) + expr(k - 1) + ")"
    ctx = {"x": 1, "l": [3, 1, 2], "d": {"k": "v", "n": None}, "s": "abc", "u": " héllo wörld ",
           "f": 2.75, "m": [{"r": "u", "c": "hi"}, {"r": "a", "c": ""}, {"r": "u", "c": "x"}]}
    loop_atoms = ["loop.index", "loop.index0", "loop.first", "loop.last", "loop.length",
                  "loop.revindex", "loop.previtem", "loop.nextitem", "loop.cycle('a', 'b')", "it",
                  "ns.c", "v", "it|string|length", "loop.depth"]
    def sexpr(in_loop):
        pool = atoms + (loop_atoms if in_loop else ["ns.c", "v"])
        a = rng.choice(pool)
        if rng.random() < 0.4:
            a = "(%s%s%s)" % (a, rng.choice(ops), rng.choice(pool))
        return a
    def stmts(k, in_loop):
        parts = []
        for _ in range(rng.randint(1, 3)):
            r = rng.random()
            ws = rng.choice(["", "-"])
            if r < 0.25 and k > 0:
                seq, tgt = rng.choice([("l", "it"), ("m", "it"), ("range(3)", "it"), ("d", "it"),
                                       ("s", "it"), ("d.items()", "it, v"), ("l|sort", "it"),
                                       ("[]", "it"), ("m|selectattr('c')", "it")])
                cond = (" if " + sexpr(False).replace("v", "it")) if rng.random() < 0.2 else ""
                els = ("{% else %}" + stmts(k - 1, in_loop)) if rng.random() < 0.2 else ""
                parts.append("{%%%s for %s in %s%s %%}%s%s{%% endfor %%}" % (
                    ws, tgt, seq, cond, stmts(k - 1, True), els))
            elif r < 0.45 and k > 0:
                parts.append("{%% if %s %%}%s{%% elif %s %%}%s{%% else %%}%s{%%%s endif %%}" % (
                    sexpr(in_loop), stmts(k - 1, in_loop), sexpr(in_loop), stmts(k - 1, in_loop),
                    stmts(k - 1, in_loop), ws))
            elif r < 0.55:
                parts.append("{%% set v = %s %%}" % sexpr(in_loop))
            elif r < 0.65:
                parts.append("{%% set ns.c = ns.c ~ %s %%}" % sexpr(in_loop))
            elif r < 0.7 and in_loop:
                parts.append(rng.choice(["{% break %}", "{% continue %}"]))
            elif r < 0.75 and k > 0:
                parts.append("{%% macro mm(a, b=2) %%}%s[{{ a }}{{ b }}]{%% endmacro %%}{{ mm(%s) }}" % (
                    stmts(k - 1, False), sexpr(in_loop)))
            else:
                parts.append("{{%s %s }}" % (ws, sexpr(in_loop)))
            parts.append(rng.choice(texts))
        return "".join(parts)
    out = []
    for i in range(n):
        if i % 3 == 0:
            depth[0] = 0
            out.append((body(4), ctx))
        elif i % 3 == 1:
            out.append(("{{ %s }}" % expr(3), ctx))
        else:
            out.append(("{% set ns = namespace(c='') %}{% set v = 0 %}" + stmts(3, False) +
                        "|{{ ns.c }}|{{ v }}", ctx))
    return out


def main():
    env = make_env()
    out = []
    cases = CASES
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jinja_cases.json")
    if len(sys.argv) == 5 and sys.argv[1] == "--random":
        cases = random_cases(int(sys.argv[2]), int(sys.argv[3]))
        path = sys.argv[4]
    for template, context in cases:
        case = {"template": template, "context": context}
        try:
            case["expected"] = env.from_string(template).render(**context)
        except (TemplateError, TypeError, ValueError, ZeroDivisionError, OverflowError,
                AttributeError, KeyError, IndexError) as e:
            case["error"] = type(e).__name__ + ": " + str(e)
        out.append(case)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"generator": "gen_jinja_cases.py", "jinja2": jinja2.__version__, "cases": out},
                  f, ensure_ascii=False, indent=None if cases is not CASES else 1)
        f.write("\n")
    print(f"wrote {len(out)} cases to {path}")


if __name__ == "__main__":
    main()
