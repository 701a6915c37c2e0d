"""The chat template seed 001 renders its prompts with: ``Videollama3Processor``'s.

Seed 001 ``BudgetedVideoLLM.__init__``::

    self.processor = Videollama3Processor.from_pretrained(model_path, trust_remote_code=False)
    self.tok = self.processor.tokenizer

and the fork's processor (chicheng567/OnlineLong@0b046341:videollama3/model/processor.py:Videollama3Processor.__init__)
overwrites the tokenizer's template with its own::

    if chat_template is None:
        chat_template = DEFAULT_CHAT_TEMPLATE
    tokenizer.chat_template = chat_template

``chat_template`` is what ``ProcessorMixin.from_pretrained`` found among the *processor's* files of the checkpoint
(transformers ``ProcessorMixin.get_processor_dict``: a ``chat_template`` key of ``processor_config.json``, else the
legacy ``chat_template.json``, else ``chat_template.jinja`` and ``chat_templates/*.jinja``), so the template of
``tokenizer_config.json`` is never used, and a checkpoint that saves none gets ``DEFAULT_CHAT_TEMPLATE``.
"""
from __future__ import annotations

from pathlib import Path

# chicheng567/OnlineLong@0b046341:videollama3/model/processor.py:DEFAULT_CHAT_TEMPLATE, assembled as the module
# assembles it (DEFAULT_IMAGE_TOKEN = "<image>", videollama3/constants.py); a fact to reproduce byte for byte (the
# ``\n`` inside the jinja string literals are real newlines, as in the fork's non-raw triple-quoted strings; tested
# against the quoted source in tests/reference/)
_IMAGE = "<image>"
VIDEOLLAMA3_CHAT_TEMPLATE = """
{%- set identifier = 'im' %}
{% for message in messages %}
    {% if add_system_prompt and loop.first and message['role'] != 'system' %}
        {{- '<|im_start|>system\nYou are VideoLLaMA3 created by Alibaba DAMO Academy, a helpful assistant to help people understand images and videos.<|im_end|>\n' -}}
    {% endif %}
    {% if message['role'] == 'stream' %}
        {% set identifier = 'stream' %}
    {% else %}
        {% set identifier = 'im' %}
    {% endif %}
    {{- '<|' + identifier + '_start|>' + message['role'] + '\n' -}}
    {% if message['content'] is string %}
        {{- message['content'] + '<|' + identifier + '_end|>\n' -}}
    {% else %}
        {% for content in message['content'] %}
            {% if content is string %}
                {{- content -}}
            {% elif content['type'] == 'text' or 'text' in content %}
                {{- content['text'] -}}
            {% elif content['type'] == 'image' or 'image' in content %}
                {% if 'timestamp' in content %}
                    {{- 'Time ' + content['timestamp'] | round(1) | string + 's: ' -}}
                {% endif %}
"""
VIDEOLLAMA3_CHAT_TEMPLATE += """
                {{- '%s\n' -}}
""" % _IMAGE
VIDEOLLAMA3_CHAT_TEMPLATE += """
            {% elif content['type'] == 'video' or 'video' in content %}
                {% for i in range(content['num_frames']) %}
                    {% if 'timestamps' in content %}
                        {{- 'Time ' + content['timestamps'][i] | round(1) | string + 's:' -}}
                    {% endif %}
                    {% if i < content['num_frames'] - 1 %}
"""
VIDEOLLAMA3_CHAT_TEMPLATE += """
                        {{- '%s,' -}}
""" % _IMAGE
VIDEOLLAMA3_CHAT_TEMPLATE += """
                    {% else %}
"""
VIDEOLLAMA3_CHAT_TEMPLATE += """
                        {{- '%s\n' -}}
""" % _IMAGE
VIDEOLLAMA3_CHAT_TEMPLATE += """
                    {% endif %}
                {% endfor %}
            {% endif %}
        {% endfor %}
        {% if identifier == 'stream' %}
            {{- '<|' + identifier + '_end|>' -}}
        {% else %}
            {{- '<|' + identifier + '_end|>\n' -}}
        {% endif %}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' -}}
{% endif %}
"""


def processor_chat_template(checkpoint_dir: str | Path) -> str | dict[str, str]:
    """The template ``Videollama3Processor.from_pretrained(checkpoint_dir)`` puts on its tokenizer.

    The processor's saved template as transformers' ``ProcessorMixin.get_processor_dict`` reads it (a dict when the
    checkpoint saves several, as transformers keeps them), else :data:`VIDEOLLAMA3_CHAT_TEMPLATE`.

    Raises:
        OSError: a processor file of the directory is not valid JSON (transformers' message).
    """
    from transformers import ProcessorMixin

    found = ProcessorMixin.get_processor_dict(str(checkpoint_dir))[0].get("chat_template")
    return found if found else VIDEOLLAMA3_CHAT_TEMPLATE
