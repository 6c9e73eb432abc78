from django import forms

from .samples import KINDS


class EnqueueForm(forms.Form):
    kind = forms.ChoiceField(label="Job", choices=[(key, label) for key, (_, _, label) in KINDS.items()])
    count = forms.IntegerField(label="How many", min_value=1, max_value=1000, initial=10)
