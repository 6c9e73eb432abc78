"""The paused queues in the admin: pause a queue (the add form), resume selected ones (an action).

Both need ``axa_django.pause_queue``; seeing the list needs that or ``view_queuepause``.
Resuming goes through ``queues.resume`` so that idle workers wake at once.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from .. import queues
from ..models import QueuePause
from ..selection import check_queue

PERMISSION = "axa_django.pause_queue"


class PauseForm(forms.ModelForm):
    """Queue name and reason, checked as ``queues.pause`` checks them."""

    class Meta:
        model = QueuePause
        fields = ["queue", "reason"]
        widgets = {"queue": forms.TextInput(), "reason": forms.TextInput(attrs={"size": 80})}

    def clean_queue(self) -> str:
        try:
            return check_queue(self.cleaned_data["queue"])
        except ValueError as error:
            raise forms.ValidationError(str(error)) from None

    def clean_reason(self) -> str:
        try:
            return queues._reason(self.cleaned_data.get("reason") or "")
        except (TypeError, ValueError) as error:
            raise forms.ValidationError(str(error)) from None


@admin.register(QueuePause)
class QueuePauseAdmin(admin.ModelAdmin):
    """Paused queues; "Add" pauses one, the action resumes."""

    form = PauseForm
    list_display = ("queue", "reason", "paused_by", "paused_at")
    actions = ["resume_queues"]

    def has_pause_permission(self, request: HttpRequest) -> bool:
        """May this user pause and resume queues (``axa_django.pause_queue``)."""
        return request.user.has_perm(PERMISSION)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_pause_permission(request) or request.user.has_perm("axa_django.view_queuepause")

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return self.has_pause_permission(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # resuming must notify the workers: the action does, a plain DELETE would not

    def save_model(self, request: HttpRequest, obj: QueuePause, form: Any, change: bool) -> None:
        queues.pause(obj.queue, obj.reason, by=request.user.get_username())

    @admin.action(description="Resume selected queues", permissions=["pause"])
    def resume_queues(self, request: HttpRequest, queryset: QuerySet[QueuePause]) -> None:
        resumed = [p.queue for p in queryset if queues.resume(p.queue)]
        for name in resumed:
            self.message_user(request, f"Queue {name!r} resumed; idle workers were woken.", messages.SUCCESS)
