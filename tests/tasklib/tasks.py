"""A library's tasks: written for Django 5.2, so with the backport's decorator on any Django."""

from django_tasks import task


@task
def index_page(page_id: int) -> dict:
    return {"indexed": page_id}


@task(priority=5)
def purge(urls: list[str]) -> int:
    if not urls:
        raise ValueError("nothing to purge")
    return len(urls)
