from django.core.management.base import BaseCommand

from topics.services import topics_load_demo


class Command(BaseCommand):
    help = "Load the thesis's demo topic trees (ALL:ALARM:..., Object:Food:...); safe to run twice."

    def handle(self, *args: object, **options: object) -> None:
        total = topics_load_demo()
        self.stdout.write(f"topic tree ready: {total} topics")
